// shape_only_comm.h: a stand-in for a group of `size` ranks on device buffers, as its rank 0: enough
// to build a model that is one rank of several (its shape checks, its allocations), which issues no
// collective before its first pass (every collective here fails).
#pragma once

#include <memory>

#include "llmc/dist/comm.h"

namespace llmc {

class ShapeOnlyComm : public Communicator {
public:
    explicit ShapeOnlyComm(int size) : size_(size) {}
    int rank() const override { return 0; }
    int world_size() const override { return size_; }
    const char* backend() const override { return "shape-only"; }
    bool uses_device_buffers() const override { return true; }
    CommHandle all_reduce_sum(void*, size_t, CommDtype) override { fail("ShapeOnlyComm: no collectives"); }
    CommHandle reduce_scatter_sum(const void*, void*, size_t, CommDtype) override { fail("ShapeOnlyComm: no collectives"); }
    CommHandle all_gather(const void*, void*, size_t, CommDtype) override { fail("ShapeOnlyComm: no collectives"); }
    CommHandle broadcast(void*, size_t, int) override { fail("ShapeOnlyComm: no collectives"); }
    CommHandle barrier() override { fail("ShapeOnlyComm: no collectives"); }
    CommHandle send(const void*, size_t, int) override { fail("ShapeOnlyComm: no collectives"); }
    CommHandle recv(void*, size_t, int) override { fail("ShapeOnlyComm: no collectives"); }
    std::unique_ptr<Communicator> split(int, int) override { fail("ShapeOnlyComm: no collectives"); }

private:
    int size_;
};

}  // namespace llmc
