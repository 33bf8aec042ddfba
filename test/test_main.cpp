// The main for all llmc unit tests (Catch2's implementation is catch_impl.cpp). Run from the
// repository root (fixtures are found by relative path): `make test`, or build/test_llmc "[tag]" for
// a subset.
#include "test/catch_session.h"

int main(int argc, char** argv) { return run_catch_session(argc, argv); }
