// SPDX-License-Identifier: MIT
// Linked only into sanitizer builds of tests and apps. The Vulkan loader dlclose()s its driver
// (ICD) when the last instance goes; LeakSanitizer then cannot name the module of the driver's own
// leaks ("<unknown module>") and driver suppressions in tests/support/lsan.supp cannot match.
// Loading each installed ICD once with RTLD_NODELETE keeps it mapped until exit.
#include <dlfcn.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

namespace {

[[gnu::constructor]] void lavaflow_pin_vulkan_icds() {
  static const std::regex path_re("\"library_path\"\\s*:\\s*\"([^\"]+)\"");
  for (const char* dir : {"/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"}) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      std::ifstream in(entry.path());
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::smatch m;
      if (std::regex_search(text, m, path_re)) (void)dlopen(m[1].str().c_str(), RTLD_LAZY | RTLD_NODELETE);
    }
  }
}

}  // namespace
