// lavaflow::c from an installed package: the header compiles and the library links.
#include <lavaflow/lavaflow.h>

#include <cstdio>

int main() {
  int major = 0, minor = 0, patch = 0;
  lf_version(&major, &minor, &patch);
  std::printf("lavaflow C API %d.%d.%d (ABI %d)\n", major, minor, patch, lf_abi_version());
  return major == LAVAFLOW_VERSION_MAJOR && minor == LAVAFLOW_VERSION_MINOR ? 0 : 1;
}
