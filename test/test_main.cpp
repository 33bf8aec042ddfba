// The Catch2 main for all llmc unit tests. Run from the repository root (fixtures are found by
// relative path): `make test`, or build/test_llmc "[tag]" for a subset.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
