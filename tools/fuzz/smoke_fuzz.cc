// The fuzzing machinery's own target: sums the input so the sanitizers see every byte read.
#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  volatile uint32_t sum = 0;
  for (size_t i = 0; i < size; ++i) sum = sum + data[i];
  return 0;
}
