#include PROBE_HEADER

int main() {
  PROBE_CALL;
  return 0;
}
