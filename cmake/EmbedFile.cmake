# cmake -DINPUT=file -DOUTPUT=file.cpp -P EmbedFile.cmake: writes the bytes of INPUT as a C++ array.
file(READ ${INPUT} hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR n "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUTPUT} "// Generated from ${INPUT}; do not edit.\n#include <cstddef>\n#include <cstdint>\nnamespace zshard {\nextern const uint8_t kDefaultCorpus[];\nextern const size_t kDefaultCorpusSize;\nconst uint8_t kDefaultCorpus[] = {\n${bytes}0};\nconst size_t kDefaultCorpusSize = ${n};\n}  // namespace zshard\n")
