// test/fixture_reader.h: reads the binary fixtures dev/ref's PyTorch generators write (little-endian
// int32 and float32 arrays, one after the other, as each generator's docstring lists them). Every
// read must be whole, and at_end() tells whether the test read the file exactly to its end, which
// is how a test notices that its reading and the generator's format have drifted apart.
#pragma once

#include <catch2/catch.hpp>

#include <cstdio>
#include <vector>

namespace llmc {

class FixtureReader {
   public:
    explicit FixtureReader(const char* path) : f_(fopen(path, "rb")) { REQUIRE(f_ != nullptr); }
    ~FixtureReader() { fclose(f_); }
    FixtureReader(const FixtureReader&) = delete;
    FixtureReader& operator=(const FixtureReader&) = delete;

    template <typename T>
    std::vector<T> read(size_t n) {
        std::vector<T> v(n);
        REQUIRE(fread(v.data(), sizeof(T), n, f_) == n);
        return v;
    }
    bool at_end() {
        char extra;
        return fread(&extra, 1, 1, f_) == 0;
    }

   private:
    FILE* f_;
};

}  // namespace llmc
