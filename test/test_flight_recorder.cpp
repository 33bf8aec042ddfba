// Tests for llmc/dist/flight_recorder.h: sequence numbers per communicator, the status a heartbeat
// sends (issued and completed counts, the oldest operation in flight, the last completed), the
// ring's wrap-around, the formatted record, and the SIGTERM text's double buffer.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <string>

#include "llmc/dist/flight_recorder.h"

using namespace llmc;
using Catch::Contains;

TEST_CASE("flight recorder: sequence numbers per communicator, counts and the oldest in flight", "[flight]") {
    FlightRecorder fr;
    int world = fr.register_comm("communicator 0 (the world)", {0, 1});
    int group = fr.register_comm("communicator 1 (group {1})", {1});
    REQUIRE(world == 0);
    REQUIRE(group == 1);
    REQUIRE(fr.comm_ranks(group) == std::vector<int>{1});
    fr.set_step(7);
    uint64_t seq = 0;
    uint64_t a = fr.begin(world, "all_reduce of 4 f32", 16, &seq);
    REQUIRE(seq == 1);
    uint64_t b = fr.begin(world, "barrier", 0, &seq);
    REQUIRE(seq == 2);
    uint64_t c = fr.begin(group, "all_gather of 2 f32 per rank", 8, &seq);
    REQUIRE(seq == 1);  // each communicator counts its own

    RankStatus s = fr.status(3, RankStatus::RUNNING);
    REQUIRE(s.rank == 3);
    REQUIRE(s.step == 7);
    REQUIRE(s.comms == 2);
    REQUIRE(s.issued[world] == 2);
    REQUIRE(s.issued[group] == 1);
    REQUIRE(s.completed[world] == 0);
    REQUIRE(s.waiting.comm == world);  // the oldest in flight
    REQUIRE(s.waiting.seq == 1);
    REQUIRE(std::string(s.waiting.op) == "all_reduce of 4 f32");
    REQUIRE(s.last_done.comm == -1);

    fr.end(a, false);
    s = fr.status(3, RankStatus::RUNNING);
    REQUIRE(s.completed[world] == 1);
    REQUIRE(s.last_done.seq == 1);
    REQUIRE(s.waiting.seq == 2);  // now the barrier
    fr.end(b, true);              // a failure is not a completion
    fr.end(c, false);
    s = fr.status(3, RankStatus::RUNNING);
    REQUIRE(s.completed[world] == 1);
    REQUIRE(s.completed[group] == 1);
    REQUIRE(s.waiting.comm == -1);
    REQUIRE(s.last_done.comm == group);

    std::string text = fr.format(10);
    REQUIRE_THAT(text, Contains("#1 on communicator 0 (the world), step 7: all_reduce of 4 f32 (16 bytes)"));
    REQUIRE_THAT(text, Contains("#2 on communicator 0 (the world), step 7: barrier (0 bytes)"));
    REQUIRE_THAT(text, Contains("FAILED after"));
    REQUIRE_THAT(text, Contains("#1 on communicator 1 (group {1})"));
}

TEST_CASE("flight recorder: the ring keeps the newest entries; ends of overwritten ones are ignored", "[flight]") {
    FlightRecorder fr;
    int comm = fr.register_comm("c", {0});
    uint64_t first = fr.begin(comm, "op 1", 4);
    for (size_t i = 2; i <= FlightRecorder::kRingSize + 5; i++) fr.end(fr.begin(comm, strformat("op %zu", i).c_str(), 4), false);
    fr.end(first, false);  // its slot was reused: no effect, no crash
    RankStatus s = fr.status(0, RankStatus::RUNNING);
    REQUIRE(s.issued[comm] == FlightRecorder::kRingSize + 5);
    REQUIRE(s.completed[comm] == FlightRecorder::kRingSize + 5);
    REQUIRE(s.waiting.comm == -1);  // op 1 fell out of the ring
    std::string text = fr.format(3);
    REQUIRE_THAT(text, Contains("op 261"));
    REQUIRE_THAT(text, Contains("op 259"));
    REQUIRE_THAT(text, !Contains("op 258"));
}

TEST_CASE("flight recorder: the termination text is written whole from the last buffer set", "[flight]") {
    FlightRecorder fr;
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    fr.set_termination_text("first\n");
    fr.set_termination_text("second\n");
    fr.write_termination_text(fds[1]);
    close(fds[1]);
    char buf[64] = {};
    ssize_t n = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    REQUIRE(std::string(buf, n > 0 ? (size_t)n : 0) == "second\n");
}

TEST_CASE("flight recorder: a peer declared dead keeps the first message", "[flight]") {
    FlightRecorder fr;
    REQUIRE(!fr.peer_dead());
    REQUIRE(fr.peer_report(0, 1).empty());  // no heartbeat: no peer report
    fr.set_peer_dead("rank 1 is gone");
    fr.set_peer_dead("rank 2 is gone");
    REQUIRE(fr.peer_dead());
    REQUIRE(fr.peer_dead_message() == "rank 1 is gone");
    fr.set_peer_report([](int comm, uint64_t seq) { return strformat("comm %d seq %llu", comm, (unsigned long long)seq); });
    REQUIRE(fr.peer_report(2, 9) == "comm 2 seq 9");
}
