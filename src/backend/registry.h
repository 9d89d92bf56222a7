// The backends this build has, by the name `--backend` takes. Adding a backend: implement Backend in
// its own folder under src/backend/, give it a library target in CMakeLists.txt, and list it here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace gemma4rt::backend {

struct BackendOptions {
  std::string name = "cpu";
  int threads = 0;   // host threads; 0 = one per core this process may use
  int device = -1;   // the device of a GPU backend (gemma4rt devices lists them); -1 = its own choice
};

// Throws Error naming the known backends for an unknown name.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
const std::vector<std::string>& backend_names();

}  // namespace gemma4rt::backend
