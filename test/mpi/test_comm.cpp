// test_comm.cpp: checks the host communicators (MpiComm under mpirun, LocalComm without a launcher
// or at one rank) against results every rank can compute alone.
//
// The idea: each rank's input is a pure function of (test seed, rank, index), so any rank can
// rebuild every other rank's data and compute the exact expected result without communicating.
// A standalone program, not Catch2: it runs under mpirun (test/mpi/run_comm_tests.sh), prints one
// "ok" line per property on rank 0 once every rank has passed it, and on a failed check aborts the
// whole launch with exit code 1.
//
//   test_comm                  all properties
//   test_comm --timeout-test   the last rank never joins an all_reduce; the others must time out
//                              with a clear error, print it and abort the launch with code 3
//   test_comm --group-timeout-test
//                              4 ranks in groups {0,1} {2,3}; rank 3 never joins: rank 2 times out
//                              in its group while {0,1} carries on, then aborts with code 3
//
// With 2 or more ranks the suite also runs on sub-groups split from the world (and the mesh's process
// groups), with data derived from world ranks so the checks prove which ranks took part.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "llmc/dist/bootstrap.h"
#include "llmc/dist/process_groups.h"

using namespace llmc;
using Clock = std::chrono::steady_clock;

#define CHECK(cond, ...)                                                                         \
    do {                                                                                         \
        if (!(cond))                                                                             \
            fail(strformat("check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond) + strformat(__VA_ARGS__)); \
    } while (0)

static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// ---- deterministic data ----

static uint64_t mix(uint64_t x) {  // splitmix64's finaliser: a bijection that scrambles every bit
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
static uint64_t bits_at(uint64_t seed, int rank, size_t i) { return mix(mix(mix(seed) ^ (uint64_t)rank) ^ i); }

// f32 in [-1, 1).
static float f32_at(uint64_t seed, int rank, size_t i) { return (float)(bits_at(seed, rank, i) >> 40) * 0x1p-23f - 1.0f; }

static float bf16_to_f(uint16_t bits) {  // the test's own conversion, independent of comm_mpi.h
    uint32_t word = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &word, sizeof value);
    return value;
}
// Multiples of 1/8 in [-1, 1): any sum over up to 32 ranks is exact in bf16 (8 significant bits), so
// the result is bitwise determined whatever order MPI adds in.
static uint16_t bf16_exact_at(uint64_t seed, int rank, size_t i) {
    float value = (float)((int)(bits_at(seed, rank, i) >> 60) - 8) / 8.0f;
    uint32_t word;
    memcpy(&word, &value, sizeof word);
    return (uint16_t)(word >> 16);
}
// Any finite bf16 of magnitude in [2^-8, 2): sums of two round, exercising the reduction's rounding.
static uint16_t bf16_random_at(uint64_t seed, int rank, size_t i) {
    uint64_t bits = bits_at(seed, rank, i);
    uint16_t sign = (uint16_t)((bits & 1) << 15);
    uint16_t exponent = (uint16_t)(127 - 8 + (bits >> 1) % 9);
    uint16_t mantissa = (uint16_t)((bits >> 8) & 0x7f);
    return (uint16_t)(sign | exponent << 7 | mantissa);
}
// Round-to-nearest-even of a finite x to bf16, by picking the nearer of its two bf16 neighbours.
static uint16_t reference_round_bf16(double x) {
    float f = (float)x;  // exact: callers pass sums of two bf16 values
    uint32_t word;
    memcpy(&word, &f, sizeof word);
    uint16_t toward_zero = (uint16_t)(word >> 16), away = (uint16_t)(toward_zero + 1);
    double below = std::fabs(x - bf16_to_f(toward_zero)), above = std::fabs(bf16_to_f(away) - x);
    if (below != above) return below < above ? toward_zero : away;
    return (toward_zero & 1) ? away : toward_zero;
}

static uint64_t fnv1a(uint64_t hash, const void* data, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) hash = (hash ^ ((const uint8_t*)data)[i]) * 0x100000001B3ull;
    return hash;
}

// ---- the suite ----

static const size_t kCounts[] = {1, 7, 1000, 1 << 20};

struct Suite {
    Communicator& comm;
    int rank, world;
    uint64_t results_hash = 0xCBF29CE484222325ull;  // of every result that must agree across ranks
    bool prints = true;  // whether rank 0 prints the ok lines (not on sub-groups: their caller sums up)

    explicit Suite(Communicator& c) : comm(c), rank(c.rank()), world(c.world_size()) {}

    // Reached only when this rank passed; the barrier means every rank did (a failing rank aborts).
    void ok(const std::string& property) {
        comm.barrier().wait();
        if (rank == 0 && prints) printf("ok  [%s, %d rank%s] %s\n", comm.backend(), world, world > 1 ? "s" : "", property.c_str());
        fflush(stdout);
    }
    void agree(const void* data, size_t bytes) { results_hash = fnv1a(results_hash, data, bytes); }

    void all_reduce_f32() {
        for (size_t count : kCounts) {
            uint64_t seed = 100 + count;
            std::vector<float> buf(count);
            for (size_t i = 0; i < count; i++) buf[i] = f32_at(seed, rank, i);
            comm.all_reduce_sum(buf.data(), count, CommDtype::F32).wait();
            for (size_t i = 0; i < count; i++) {
                double exact = 0, magnitude = 0;
                for (int r = 0; r < world; r++) {
                    exact += f32_at(seed, r, i);
                    magnitude += std::fabs(f32_at(seed, r, i));
                }
                double tolerance = world * 0x1p-23 * magnitude;  // one f32 rounding per addition
                CHECK(std::fabs(buf[i] - exact) <= tolerance, "count %zu, element %zu: got %.9g, exact sum %.9g", count, i,
                      buf[i], exact);
            }
            agree(buf.data(), count * sizeof(float));
        }
        ok("all_reduce_sum f32 matches the locally computed sum (counts 1, 7, 1000, 1<<20)");
    }

    void all_reduce_bf16() {
        for (size_t count : kCounts) {
            uint64_t seed = 200 + count;
            std::vector<uint16_t> buf(count);
            for (size_t i = 0; i < count; i++) buf[i] = bf16_exact_at(seed, rank, i);
            comm.all_reduce_sum(buf.data(), count, CommDtype::BF16).wait();
            for (size_t i = 0; i < count; i++) {
                float exact = 0;
                for (int r = 0; r < world; r++) exact += bf16_to_f(bf16_exact_at(seed, r, i));
                CHECK(bf16_to_f(buf[i]) == exact, "count %zu, element %zu: got %g, exact sum %g", count, i,
                      bf16_to_f(buf[i]), exact);
            }
            agree(buf.data(), count * 2);
        }
        ok("all_reduce_sum bf16 is exact on exactly representable sums (counts 1, 7, 1000, 1<<20)");

        if (world < 2) return;
        // Ranks 0 and 1 add arbitrary bf16 values and the rest add +0, so whatever the order the
        // result is a + b rounded once: it must equal round-to-nearest-even of the exact sum.
        size_t count = 1 << 20, ties = 0;
        std::vector<uint16_t> buf(count);
        for (size_t i = 0; i < count; i++) buf[i] = rank < 2 ? bf16_random_at(7, rank, i) : 0;
        comm.all_reduce_sum(buf.data(), count, CommDtype::BF16).wait();
        for (size_t i = 0; i < count; i++) {
            double exact = (double)bf16_to_f(bf16_random_at(7, 0, i)) + bf16_to_f(bf16_random_at(7, 1, i));
            uint16_t expected = reference_round_bf16(exact);
            CHECK(buf[i] == expected, "element %zu: %.9g rounded to bf16 0x%04x, expected 0x%04x", i, exact, buf[i], expected);
            uint16_t down = (uint16_t)(std::bit_cast<uint32_t>((float)exact) >> 16);
            ties += std::fabs(exact - bf16_to_f(down)) == std::fabs(bf16_to_f((uint16_t)(down + 1)) - exact);
        }
        CHECK(ties > 1000, "only %zu ties: the data does not exercise round-half-to-even", ties);
        agree(buf.data(), count * 2);
        ok(strformat("all_reduce_sum bf16 rounds to nearest even (1<<20 sums, %zu ties)", ties));
    }

    // Element i of rank r's contribution to a world-sized buffer, as the bytes of `dtype`.
    static void fill(CommDtype dtype, uint64_t seed, int r, size_t begin, size_t count, void* out) {
        for (size_t i = 0; i < count; i++) {
            if (dtype == CommDtype::F32) ((float*)out)[i] = f32_at(seed, r, begin + i);
            else if (dtype == CommDtype::BF16) ((uint16_t*)out)[i] = bf16_exact_at(seed, r, begin + i);
            else ((uint8_t*)out)[i] = (uint8_t)bf16_exact_at(seed, r, begin + i);
        }
    }
    static double value_at(CommDtype dtype, uint64_t seed, int r, size_t i) {
        return dtype == CommDtype::F32 ? f32_at(seed, r, i) : bf16_to_f(bf16_exact_at(seed, r, i));
    }
    static double element(CommDtype dtype, const void* data, size_t i) {
        return dtype == CommDtype::F32 ? ((const float*)data)[i] : bf16_to_f(((const uint16_t*)data)[i]);
    }

    void reduce_scatter() {
        for (CommDtype dtype : {CommDtype::F32, CommDtype::BF16}) {
            size_t size = comm_dtype_bytes(dtype);
            for (bool in_place : {false, true}) {
                for (size_t count : kCounts) {
                    uint64_t seed = 300 + count;
                    std::vector<char> send(world * count * size), separate(in_place ? 0 : count * size);
                    fill(dtype, seed, rank, 0, world * count, send.data());
                    std::vector<char> original = send;
                    char* recv = in_place ? send.data() + rank * count * size : separate.data();
                    comm.reduce_scatter_sum(send.data(), recv, count, dtype).wait();
                    for (size_t i = 0; i < count; i++) {
                        double exact = 0, magnitude = 0;
                        for (int r = 0; r < world; r++) {
                            double value = value_at(dtype, seed, r, rank * count + i);
                            exact += value;
                            magnitude += std::fabs(value);
                        }
                        double got = element(dtype, recv, i);
                        double tolerance = dtype == CommDtype::F32 ? world * 0x1p-23 * magnitude : 0;
                        CHECK(std::fabs(got - exact) <= tolerance, "%s, %s, count %zu, element %zu: got %.9g, exact %.9g",
                              comm_dtype_name(dtype), in_place ? "in place" : "separate", count, i, got, exact);
                    }
                    if (!in_place) CHECK(send == original, "%s count %zu: the send buffer was modified", comm_dtype_name(dtype), count);
                }
            }
        }
        ok("reduce_scatter_sum f32 and bf16, separate and in place, gives each rank its block of the sum");
    }

    void all_gather() {
        for (CommDtype dtype : {CommDtype::F32, CommDtype::BF16, CommDtype::U8}) {
            size_t size = comm_dtype_bytes(dtype);
            for (bool in_place : {false, true}) {
                for (size_t count : kCounts) {
                    uint64_t seed = 400 + count;
                    std::vector<char> recv(world * count * size, (char)0x5A), separate(count * size);
                    char* send = in_place ? recv.data() + rank * count * size : separate.data();
                    fill(dtype, seed, rank, 0, count, send);
                    comm.all_gather(send, recv.data(), count, dtype).wait();
                    std::vector<char> expected(world * count * size);
                    for (int r = 0; r < world; r++) fill(dtype, seed, r, 0, count, expected.data() + r * count * size);
                    CHECK(recv == expected, "%s, %s, count %zu: gathered data differs", comm_dtype_name(dtype),
                          in_place ? "in place" : "separate", count);
                    agree(recv.data(), recv.size());
                }
            }
        }
        ok("all_gather f32, bf16 and u8, separate and in place, gives every rank every block");
    }

    void broadcast() {
        for (int root : {0, world - 1}) {
            for (size_t bytes : kCounts) {
                std::vector<char> buf(bytes), expected(bytes);
                for (size_t i = 0; i < bytes; i++) expected[i] = (char)bits_at(500 + bytes, root, i);
                if (rank == root) buf = expected;
                comm.broadcast(buf.data(), bytes, root).wait();
                CHECK(buf == expected, "root %d, %zu bytes: data differs from the root's", root, bytes);
                agree(buf.data(), bytes);
            }
        }
        ok(strformat("broadcast from root 0 and from the last rank, %d (1, 7, 1000, 1<<20 bytes)", world - 1));
    }

    void barrier() {
        // Rank r arrives r * 100 ms after the first barrier, so the second cannot complete for
        // anyone before the last rank arrives. 30 ms covers how unevenly ranks leave the first.
        const double step_s = 0.1, skew_s = 0.03;
        comm.barrier().wait();
        auto start = Clock::now();
        std::this_thread::sleep_for(std::chrono::duration<double>(rank * step_s));
        CommHandle handle = comm.barrier();
        handle.wait();
        double elapsed_s = seconds_since(start), expected_s = (world - 1) * step_s - skew_s;
        CHECK(elapsed_s >= expected_s, "the barrier completed %.3f s after the first, before the last rank arrived (%.3f s)",
              elapsed_s, expected_s);
        // The time rank 0 was blocked in wait() is what wait_ms reports as exposed communication.
        if (rank == 0)
            CHECK(handle.wait_ms() >= 1000 * expected_s, "wait_ms %.1f, but rank 0 was blocked about %.0f ms",
                  handle.wait_ms(), 1000 * (world - 1) * step_s);
        ok("barrier completes only when the last rank arrives; wait_ms counts the time blocked in wait()");
    }

    void asynchrony() {
        // Three collectives in flight at once, waited in issue order.
        size_t n = 1 << 20;
        std::vector<float> reduced(n);
        for (size_t i = 0; i < n; i++) reduced[i] = f32_at(600, rank, i);
        std::vector<uint16_t> gathered(world * 1000), mine(1000);
        fill(CommDtype::BF16, 601, rank, 0, 1000, mine.data());
        std::vector<char> broadcasted(1000, rank == world - 1 ? 'R' : '?');
        CommHandle h1 = comm.all_reduce_sum(reduced.data(), n, CommDtype::F32);
        CommHandle h2 = comm.all_gather(mine.data(), gathered.data(), 1000, CommDtype::BF16);
        CommHandle h3 = comm.broadcast(broadcasted.data(), 1000, world - 1);
        h1.wait();
        h2.wait();
        h3.wait();
        for (size_t i = 0; i < n; i += 4099) {
            double exact = 0;
            for (int r = 0; r < world; r++) exact += f32_at(600, r, i);
            CHECK(std::fabs(reduced[i] - exact) <= world * 0x1p-23 * world, "all_reduce element %zu: %.9g vs %.9g", i,
                  reduced[i], exact);
        }
        for (int r = 0; r < world; r++)
            for (size_t i = 0; i < 1000; i++)
                CHECK(gathered[r * 1000 + i] == bf16_exact_at(601, r, i), "all_gather block %d element %zu", r, i);
        CHECK(broadcasted == std::vector<char>(1000, 'R'), "broadcast data differs from the root's");
        agree(reduced.data(), n * sizeof(float));
        ok("three collectives in flight at once, waited in issue order, all correct");

        // Collectives complete in issue order: once the last is done, so are the ones before it.
        CommHandle a = comm.all_reduce_sum(reduced.data(), n, CommDtype::F32);
        CommHandle b = comm.barrier();
        CommHandle c = comm.broadcast(broadcasted.data(), 1000, 0);
        c.wait();
        CHECK(a.done() && b.done(), "the third collective finished before the first (%d) or second (%d)", a.done(), b.done());
        a.wait();
        b.wait();
        ok("collectives complete in issue order (waiting on the last first)");

        // Progress without the caller: the op completes while this thread only sleeps, then wait()
        // has nothing left to block on.
        for (size_t i = 0; i < n; i++) reduced[i] = f32_at(602, rank, i);
        CommHandle d = comm.all_reduce_sum(reduced.data(), n, CommDtype::F32);
        auto start = Clock::now();
        while (!d.done() && seconds_since(start) < 60) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        CHECK(d.done(), "an all_reduce of 1<<20 f32 made no progress in 60 s while the caller slept");
        d.wait();
        CHECK(d.wait_ms() < 100, "wait() blocked %.1f ms on a collective that was already done", d.wait_ms());
        agree(reduced.data(), n * sizeof(float));
        ok("collectives progress while the caller computes (done() without wait())");
    }

    // `call` must throw an llmc::Error whose message contains needle.
    template <typename Call>
    static void expect_error(const char* what, const char* needle, Call&& call) {
        try {
            call();
        } catch (const Error& e) {
            CHECK(strstr(e.what(), needle), "%s: message '%s' does not mention '%s'", what, e.what(), needle);
            return;
        }
        fail(strformat("%s: no error", what));
    }

    void argument_errors() {
        char byte = 0;
        expect_error("broadcast from root world_size", "root", [&] { comm.broadcast(&byte, 1, world); });
        expect_error("broadcast from root -1", "root", [&] { comm.broadcast(&byte, 1, -1); });
        std::vector<float> buf(world * 4 + 1);
        // A receive block that overlaps the send buffer but is not this rank's block.
        expect_error("misaligned in-place reduce_scatter", "in place",
                     [&] { comm.reduce_scatter_sum(buf.data(), buf.data() + rank * 4 + 1, 4, CommDtype::F32); });
        expect_error("misaligned in-place all_gather", "in place",
                     [&] { comm.all_gather(buf.data() + rank * 4 + 1, buf.data(), 4, CommDtype::F32); });
        expect_error("an all_reduce of bytes", "not summed", [&] { comm.all_reduce_sum(buf.data(), 4, CommDtype::U8); });
        expect_error("a reduce_scatter of bytes", "not summed",
                     [&] { comm.reduce_scatter_sum(buf.data(), buf.data() + rank, 1, CommDtype::U8); });
        ok("bad roots, misaligned in-place buffers and sums of bytes fail at issue with a clear message");
    }

    // Rank r's message: bytes derived from (seed, r), so the receiver knows what must arrive from whom.
    static std::vector<char> message(uint64_t seed, int r, size_t bytes) {
        std::vector<char> m(bytes);
        for (size_t i = 0; i < bytes; i++) m[i] = (char)bits_at(seed, r, i);
        return m;
    }

    void send_recv() {
        if (world < 2) return;
        // A backend that deadlocks on these patterns fails with a timeout naming the message.
        const double timeout_s = comm.timeout_s;
        comm.timeout_s = 30;
        // Every rank sends two messages to the next rank before receiving two from the previous one.
        const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
        for (size_t bytes : {(size_t)1, (size_t)1000, (size_t)4 << 20}) {
            std::vector<char> first = message(700 + bytes, rank, bytes), second = message(701 + bytes, rank, bytes + 3);
            std::vector<char> got_first(bytes), got_second(bytes + 3);
            CommHandle s1 = comm.send(first.data(), bytes, next), s2 = comm.send(second.data(), bytes + 3, next);
            CommHandle r1 = comm.recv(got_first.data(), bytes, prev), r2 = comm.recv(got_second.data(), bytes + 3, prev);
            r2.wait();
            CHECK(r1.done() && s1.done() && s2.done(), "the last recv finished before earlier operations");
            CHECK(got_first == message(700 + bytes, prev, bytes), "%zu bytes: the first message from rank %d differs", bytes, prev);
            CHECK(got_second == message(701 + bytes, prev, bytes + 3), "%zu bytes: the second message from rank %d differs",
                  bytes, prev);
        }
        ok("send/recv in a ring (1, 1000 and 4 MiB): all sends issued before any recv, messages arrive in order");

        // Both ranks of a pair send 4 MiB (past MPI's eager limit: the send completes only once the
        // peer receives) before either receives; waiting on the send first must not deadlock.
        const int partner = rank ^ 1;
        if (partner < world) {
            const size_t bytes = (size_t)4 << 20;
            std::vector<char> out = message(800, rank, bytes), in(bytes);
            CommHandle sent = comm.send(out.data(), bytes, partner);
            CommHandle received = comm.recv(in.data(), bytes, partner);
            sent.wait();
            received.wait();
            CHECK(in == message(800, partner, bytes), "the 4 MiB from rank %d differ", partner);
        }
        comm.timeout_s = timeout_s;
        ok("pairwise exchange of 4 MiB: both ranks send before either receives, and it completes");
    }

    // Uneven blocks, zeros among them (a rank that sends an expert nothing): rank `from` sends
    // count(from, to) elements to `to`, element i of that block being f32_at(seed, from, to << 24 | i).
    static size_t a2a_count(int from, int to, size_t scale) { return (size_t)((from * 3 + to * 5 + 1) % 4) * scale; }
    void all_to_all() {
        for (size_t scale : {(size_t)1, (size_t)1000, (size_t)100000}) {
            const uint64_t seed = 900 + scale;
            std::vector<size_t> send_counts(world), recv_counts(world);
            for (int r = 0; r < world; r++) send_counts[r] = a2a_count(rank, r, scale), recv_counts[r] = a2a_count(r, rank, scale);
            std::vector<float> out, in;
            for (int r = 0; r < world; r++)
                for (size_t i = 0; i < send_counts[r]; i++) out.push_back(f32_at(seed, rank, (size_t)r << 24 | i));
            size_t total_in = 0;
            for (size_t c : recv_counts) total_in += c;
            in.assign(total_in, NAN);
            comm.all_to_all_v(out.data(), send_counts.data(), in.data(), recv_counts.data(), CommDtype::F32).wait();
            size_t at = 0;
            for (int r = 0; r < world; r++)
                for (size_t i = 0; i < recv_counts[r]; i++, at++)
                    CHECK(in[at] == f32_at(seed, r, (size_t)rank << 24 | i), "scale %zu: element %zu of rank %d's block differs",
                          scale, i, r);
            // bf16: the same blocks as 2-byte words
            std::vector<uint16_t> out16, in16(total_in, 0xFFFF);
            for (float x : out) out16.push_back((uint16_t)(std::bit_cast<uint32_t>(x) >> 16));
            comm.all_to_all_v(out16.data(), send_counts.data(), in16.data(), recv_counts.data(), CommDtype::BF16).wait();
            for (size_t i = 0; i < total_in; i++)
                CHECK(in16[i] == (uint16_t)(std::bit_cast<uint32_t>(in[i]) >> 16), "bf16 element %zu differs", i);
        }
        ok("all_to_all_v f32 and bf16: uneven blocks (some empty) from every rank to every rank, itself included");
    }

    void p2p_errors() {
        char byte = 0;
        expect_error("send to rank world_size", "peer must be another rank", [&] { comm.send(&byte, 1, world); });
        expect_error("recv from rank -1", "peer must be another rank", [&] { comm.recv(&byte, 1, -1); });
        expect_error("send to itself", "peer must be another rank", [&] { comm.send(&byte, 1, rank); });
        std::string expected = strformat("send of 1 bytes to rank %d on rank %d of %d", world, rank, world);
        expect_error("send to rank world_size", expected.c_str(), [&] { comm.send(&byte, 1, world); });
        expect_error("split with a negative color", "color must be >= 0", [&] { comm.split(-1, 0); });
        const std::vector<size_t> to_self(world, 0);
        std::vector<size_t> from_self(world, 0);
        from_self[rank] = 1;
        float x = 0, y = 0;
        expect_error("all_to_all_v with uneven counts to itself", "0 elements to itself but 1 from itself",
                     [&] { comm.all_to_all_v(&x, to_self.data(), &y, from_self.data(), CommDtype::F32); });
        ok("send/recv to a rank outside the communicator or to itself, and a negative split color, fail at issue");
    }

    void ranks_agree() {
        // The hash of every result that must be identical everywhere, gathered in place as bf16 words.
        std::vector<uint16_t> hashes(world * 4);
        memcpy(&hashes[rank * 4], &results_hash, sizeof results_hash);
        comm.all_gather(&hashes[rank * 4], hashes.data(), 4, CommDtype::BF16).wait();
        for (int r = 0; r < world; r++)
            CHECK(memcmp(&hashes[r * 4], &hashes[0], 8) == 0, "rank %d's results differ bitwise from rank 0's", r);
        ok("results are bitwise identical on all ranks");
    }

    void run() {
        all_reduce_f32();
        all_reduce_bf16();
        reduce_scatter();
        all_gather();
        broadcast();
        barrier();
        asynchrony();
        argument_errors();
        send_recv();
        all_to_all();
        p2p_errors();
        ranks_agree();
    }
};

// ---- sub-groups ----

static std::string ranks_text(const std::vector<int>& ranks) {
    std::string text = "{";
    for (size_t i = 0; i < ranks.size(); i++) text += strformat(i ? ",%d" : "%d", ranks[i]);
    return text + "}";
}

// `group` must consist of exactly the world ranks `members`, in group-rank order. Every rank
// contributes data derived from its WORLD rank, so a group with other ranks, or in another order,
// gives other values. The values are multiples of 1/8, so every sum is exact in f32 and bf16.
static void check_group_members(Communicator& group, const std::vector<int>& members, int world_rank) {
    const int n = (int)members.size(), me = group.rank();
    CHECK(group.world_size() == n && members[me] == world_rank, "world rank %d is rank %d of %d in its group, expected %s",
          world_rank, me, group.world_size(), ranks_text(members).c_str());
    const size_t count = 1000;
    auto value = [](uint64_t seed, int world_r, size_t i) { return bf16_to_f(bf16_exact_at(seed, world_r, i)); };
    auto sum = [&](uint64_t seed, size_t i) {
        float total = 0;
        for (int m : members) total += value(seed, m, i);
        return total;
    };
    // all_reduce, f32 and bf16
    std::vector<float> f(count);
    std::vector<uint16_t> h(count);
    for (size_t i = 0; i < count; i++) f[i] = value(900, world_rank, i), h[i] = bf16_exact_at(901, world_rank, i);
    CommHandle reduce_f = group.all_reduce_sum(f.data(), count, CommDtype::F32);
    CommHandle reduce_h = group.all_reduce_sum(h.data(), count, CommDtype::BF16);
    reduce_f.wait();
    reduce_h.wait();
    for (size_t i = 0; i < count; i++) {
        CHECK(f[i] == sum(900, i), "all_reduce f32 element %zu: %g, expected the sum over %s, %g", i, f[i],
              ranks_text(members).c_str(), sum(900, i));
        CHECK(bf16_to_f(h[i]) == sum(901, i), "all_reduce bf16 element %zu: %g, expected %g", i, bf16_to_f(h[i]), sum(901, i));
    }
    // reduce_scatter: block [me] of the sum
    std::vector<float> whole(n * count), mine(count);
    for (size_t i = 0; i < n * count; i++) whole[i] = value(902, world_rank, i);
    group.reduce_scatter_sum(whole.data(), mine.data(), count, CommDtype::F32).wait();
    for (size_t i = 0; i < count; i++)
        CHECK(mine[i] == sum(902, me * count + i), "reduce_scatter element %zu: %g, expected %g", i, mine[i],
              sum(902, me * count + i));
    // all_gather in place: block r is member r's
    std::vector<uint16_t> gathered(n * count);
    for (size_t i = 0; i < count; i++) gathered[me * count + i] = bf16_exact_at(903, world_rank, i);
    group.all_gather(&gathered[me * count], gathered.data(), count, CommDtype::BF16).wait();
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            CHECK(gathered[r * count + i] == bf16_exact_at(903, members[r], i), "all_gather block %d (world rank %d) element %zu",
                  r, members[r], i);
    // broadcast from the group's last rank
    std::vector<char> bytes = me == n - 1 ? Suite::message(904, world_rank, count) : std::vector<char>(count);
    group.broadcast(bytes.data(), count, n - 1).wait();
    CHECK(bytes == Suite::message(904, members[n - 1], count), "broadcast: not world rank %d's bytes", members[n - 1]);
    // a ring of messages
    if (n > 1) {
        const int next = (me + 1) % n, prev = (me + n - 1) % n;
        std::vector<char> out = Suite::message(905, world_rank, count), in(count);
        CommHandle sent = group.send(out.data(), count, next);
        group.recv(in.data(), count, prev).wait();
        sent.wait();
        CHECK(in == Suite::message(905, members[prev], count), "recv from group rank %d: not world rank %d's bytes", prev,
              members[prev]);
    }
    group.barrier().wait();
}

// Splits world by color_of/key_of (functions of the world rank), checks the members of this rank's
// group, and runs the whole suite on it; both groups at once.
template <typename Color, typename Key>
static void check_split(Communicator& world, const char* how, Color color_of, Key key_of) {
    const int rank = world.rank(), n = world.world_size();
    std::vector<int> members;
    for (int r = 0; r < n; r++)
        if (color_of(r) == color_of(rank)) members.push_back(r);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return key_of(a) < key_of(b); });
    std::unique_ptr<Communicator> group = world.split(color_of(rank), key_of(rank));
    check_group_members(*group, members, rank);
    Suite suite(*group);
    suite.prints = false;
    suite.run();
    world.barrier().wait();  // every group passed
    if (rank == 0) printf("ok  [%s, %d ranks] split %s: each group has exactly its ranks, and the whole suite passes on it\n",
                          world.backend(), n, how);
    fflush(stdout);
}

static void check_process_groups(Communicator& world, const ParallelDims& dims) {
    ProcessGroups groups(world, dims);
    for (MeshDim dim : kMeshDims) {
        Communicator& group = groups.group(dim);
        check_group_members(group, dims.group_ranks(dim, world.rank()), world.rank());
        CHECK((&group == &world) == (dims.size(dim) == world.world_size()),
              "the %s group should be the world communicator exactly when it spans the world", mesh_dim_name(dim));
    }
    world.barrier().wait();
    if (world.rank() == 0) printf("ok  [%s, %d ranks] process groups of the mesh %s have the mesh's ranks\n", world.backend(),
                                  world.world_size(), dims.describe().c_str());
    fflush(stdout);
}

static void check_groups(Communicator& world) {
    const int n = world.world_size();
    if (n < 2) return;
    check_split(world, "into halves, ranked by rank", [n](int r) { return r < (n + 1) / 2 ? 0 : 1; },
                [](int r) { return r; });
    check_split(world, "by parity, ranked in reverse", [](int r) { return r % 2; }, [n](int r) { return n - r; });
    check_process_groups(world, ParallelDims::data_parallel(n));
    if (n == 4) {
        ParallelDims dims;
        dims.dp = 2;
        dims.tp = 2;
        check_process_groups(world, dims);
    }
}

// Ranks {0,1} and {2,3} form groups. In {2,3} rank 3 never joins an all_reduce: rank 2 must time out
// with an error naming it, its group is broken, and its world communicator still works: rank 2 tells
// rank 0 over the world. Group {0,1} runs checked all_reduces the whole time and still after
// hearing of the timeout. Then rank 2 times out on a recv from rank 3 and aborts with code 3.
static void group_timeout_test(Communicator& world, const Launch& launch) {
    const int rank = world.rank();
    CHECK(world.world_size() == 4, "--group-timeout-test needs 4 ranks, got %d", world.world_size());
    std::unique_ptr<Communicator> group = world.split(rank / 2, rank);
    if (rank == 3) {
        std::this_thread::sleep_for(std::chrono::seconds(10));  // the aborting rank ends the launch long before
        return;
    }
    int note = 0;
    if (rank == 2) {
        group->timeout_s = 1.5;
        std::vector<float> buf(1024, 1.0f);
        auto start = Clock::now();
        std::string error;
        try {
            group->all_reduce_sum(buf.data(), buf.size(), CommDtype::F32).wait();
        } catch (const Error& e) {
            error = e.what();
        }
        double elapsed_s = seconds_since(start);
        const char* expected = "all_reduce of 1024 f32 timed out after 1.5 s on rank 0 of 2";
        CHECK(strstr(error.c_str(), expected), "message '%s' lacks '%s'", error.c_str(), expected);
        CHECK(elapsed_s >= 1.5 && elapsed_s < 5, "timed out after %.3f s, expected 1.5 s", elapsed_s);
        fprintf(stderr, "rank 2: error: %s\n", error.c_str());
        Suite::expect_error("a barrier on the broken group", "because an earlier collective failed",
                            [&] { group->barrier().wait(); });
        note = 1;
        world.send(&note, sizeof note, 0).wait();
        world.recv(&note, sizeof note, 0).wait();  // rank 0 saw its group carry on

        world.timeout_s = 1.0;
        double value = 0;
        Suite::expect_error("a recv from the absent rank", "recv of 8 bytes from rank 3 timed out after 1.0 s on rank 2 of 4",
                            [&] { world.recv(&value, sizeof value, 3).wait(); });
        printf("ok  [%s, 4 ranks] a recv from the absent rank timed out after 1.0 s naming itself\n", world.backend());
        fflush(stdout);
        abort_launch(launch, 3);
    }
    // Ranks 0 and 1: checked all_reduces on their group until rank 0 has heard from rank 2, then one more.
    CommHandle heard;
    if (rank == 0) heard = world.recv(&note, sizeof note, 2);
    for (int round = 0, last = 0;; round++) {
        float values[2] = {(float)(rank + round), (float)(rank == 0 && heard.done())};
        group->all_reduce_sum(values, 2, CommDtype::F32).wait();
        CHECK(values[0] == (float)(1 + 2 * round), "round %d: group {0,1} summed %g, expected %d", round, values[0],
              1 + 2 * round);
        if (last) {
            if (rank == 0) {
                printf("ok  [%s, 4 ranks] group {0,1} ran %d checked all_reduces while group {2,3} timed out, and one "
                       "after\n", world.backend(), round + 1);
                fflush(stdout);
                world.send(&note, sizeof note, 2).wait();
            }
            std::this_thread::sleep_for(std::chrono::seconds(10));  // rank 2 aborts the launch
            fail("the launch was not aborted");
        }
        last = values[1] > 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

// The last rank never joins; every other rank's all_reduce must fail with a timeout that names it,
// every later collective must fail at once with the same cause, and the launch ends with code 3.
static void timeout_test(Communicator& comm, const Launch& launch) {
    int rank = comm.rank(), world = comm.world_size();
    CHECK(world >= 2, "--timeout-test needs at least 2 ranks, got %d", world);
    if (rank == world - 1) {
        std::this_thread::sleep_for(std::chrono::seconds(10));  // the aborting ranks end the launch long before
        return;
    }
    comm.timeout_s = 1.5;
    std::vector<float> buf(1024, 1.0f);
    auto start = Clock::now();
    CommHandle handle = comm.all_reduce_sum(buf.data(), buf.size(), CommDtype::F32);
    try {
        handle.wait();
    } catch (const Error& e) {
        double elapsed_s = seconds_since(start);
        std::string expected = strformat("all_reduce of 1024 f32 timed out after 1.5 s on rank %d of %d", rank, world);
        CHECK(strstr(e.what(), expected.c_str()), "message '%s' lacks '%s'", e.what(), expected.c_str());
        CHECK(elapsed_s >= 1.5, "timed out after %.3f s, before timeout_s", elapsed_s);
        auto later_start = Clock::now();
        try {
            comm.barrier().wait();
        } catch (const Error& later) {
            CHECK(strstr(later.what(), "barrier") && strstr(later.what(), e.what()),
                  "the barrier after the timeout failed with '%s', not naming itself and the first failure", later.what());
            CHECK(seconds_since(later_start) < 0.5, "the barrier after the timeout took %.3f s to fail",
                  seconds_since(later_start));
            if (rank == 0)
                printf("ok  [%s, %d ranks] all_reduce timed out after %.2f s naming itself; a later barrier failed at "
                       "once with the same cause\n", comm.backend(), world, elapsed_s);
            fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
            abort_launch(launch, 3);
        }
        fail("a barrier succeeded after the communicator broke");
    }
    fail(strformat("the all_reduce completed although rank %d never joined", world - 1));
}

int main(int argc, char** argv) {
    Launch launch;
    try {
        launch = bootstrap_launch(&argc, &argv);
        bool timeout_mode = argc > 1 && strcmp(argv[1], "--timeout-test") == 0;
        bool group_timeout_mode = argc > 1 && strcmp(argv[1], "--group-timeout-test") == 0;
        CHECK(argc == 1 || timeout_mode || group_timeout_mode,
              "unknown argument '%s' (the only ones are --timeout-test and --group-timeout-test)", argv[1]);
        {
            std::unique_ptr<Communicator> comm = make_host_communicator(launch);
            CHECK(comm->rank() == launch.rank && comm->world_size() == launch.world_size,
                  "communicator says rank %d of %d, the launch %d of %d", comm->rank(), comm->world_size(), launch.rank,
                  launch.world_size);
            CHECK(launch.local_rank >= 0 && launch.local_rank < launch.local_size && launch.local_size <= launch.world_size,
                  "local rank %d of %d in a world of %d", launch.local_rank, launch.local_size, launch.world_size);
            if (timeout_mode) {
                timeout_test(*comm, launch);
            } else if (group_timeout_mode) {
                group_timeout_test(*comm, launch);
            } else {
                auto start = Clock::now();
                Suite(*comm).run();
                check_groups(*comm);
                if (launch.world_size == 1 && launch.under_launcher) {
                    LocalComm local;  // one rank under mpirun: LocalComm gets the same checks
                    Suite(local).run();
                }
                if (launch.rank == 0) printf("all passed in %.2f s\n", seconds_since(start));
            }
        }
        finalize_launch(launch);
    } catch (const Error& e) {
        fprintf(stderr, "rank %d: FAILED: %s\n", launch.rank, e.what());
        abort_launch(launch, 1);
    }
    return 0;
}
