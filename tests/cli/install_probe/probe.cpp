#include PROBE_HEADER

int main() { return 0; }
