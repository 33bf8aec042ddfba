// comm_nccl_check.cu: compiles the GPU communicator with nvcc, together with bootstrap.h as the CUDA
// trainer will include them, so `make` catches its errors on machines without a GPU. Never run:
// constructing an NcclComm here instantiates the class and every virtual member.
#include <memory>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/comm_nccl.cuh"

std::unique_ptr<llmc::Communicator> make_nccl_comm_for_check(const llmc::Launch& launch) {
    std::unique_ptr<llmc::Communicator> host = llmc::make_host_communicator(launch);
    return std::make_unique<llmc::NcclComm>(*host, launch.local_rank);
}
