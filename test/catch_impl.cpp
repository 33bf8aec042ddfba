// Catch2's implementation, compiled once (by g++) and linked into every Catch2 test program:
// build/test_llmc and build/test_cuda_host (with test_main.cpp) and build/test_cuda_model (which has
// its own main). Catch::Session is declared only where the implementation is compiled, so the mains
// start the tests through run_catch_session (catch_session.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "test/catch_session.h"

int run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
