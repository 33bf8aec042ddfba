# shellcheck shell=bash
# dev/bench/carried_mpi.sh: sourced, points this shell at the Open MPI that `gpu_session.sh prepare`
# unpacked into .device/mpi (Debian 12's Open MPI 4.1.4 packages, extracted with dpkg -x), so that
# mpirun, mpicxx --showme and programs linked to libmpi run from there on a machine with no MPI.
#   source dev/bench/carried_mpi.sh [DIR]      (DIR defaults to .device/mpi of this checkout)
#
# The one idea: Open MPI finds its plugins, help texts and wrapper data through paths compiled in as
# /usr/...; OPAL_PREFIX moves every path under the prefix to DIR/usr, and OPAL_SYSCONFDIR the one that
# is not (/etc/openmpi). PMIx (libpmix, Open MPI's launch interface) has its own prefix, moved the
# same way. Only the shared-memory transports are unpacked (btl self and vader): the network ones
# need InfiniBand, UCX or libfabric libraries that one machine with one GPU has no use for.

carried_mpi_dir=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device/mpi}
if [ ! -x "$carried_mpi_dir/usr/bin/orterun" ]; then
    echo "carried_mpi.sh: no Open MPI in $carried_mpi_dir (run dev/bench/gpu_session.sh prepare)" >&2
    return 1 2> /dev/null || exit 1
fi
carried_mpi_dir=$(cd "$carried_mpi_dir" && pwd)
export OPAL_PREFIX="$carried_mpi_dir/usr"
export OPAL_SYSCONFDIR="$carried_mpi_dir/etc/openmpi"
export PMIX_PREFIX="$carried_mpi_dir/usr/lib/x86_64-linux-gnu/pmix2"
export PATH="$carried_mpi_dir/usr/bin:$PATH"
# libmpi and Open MPI's own libraries, the libraries they need (hwloc, libevent, PMIx, munge), and
# libmpi.so for the linker (mpicxx --showme:link names -L.../openmpi/lib); last, libudev, for a
# machine that has none (its own, where present, comes first)
export LD_LIBRARY_PATH="$carried_mpi_dir/usr/lib/x86_64-linux-gnu/openmpi/lib:$carried_mpi_dir/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$carried_mpi_dir/fallback"
# The device runs commands as root, and 4 ranks may share fewer cores than that in a test. The
# single-copy mechanism of the shared-memory transport (CMA, process_vm_readv) is off: a virtual
# machine or container may refuse it, and the ranks then fall back to copies through shared memory.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The H200 image has a PMIx of its own under /usr/lib/x86_64-linux-gnu/pmix2, whose plugins the
# carried one tries and cannot load (a dlopen error per rank, harmless), and no zlib plugin to
# compress with (a warning): the first GPU session's logs were full of both.
export PMIX_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
