// catch_session.h: runs the Catch2 tests linked into the program with the command line's arguments
// (test names, "[tags]", options) and returns the exit status. Defined in catch_impl.cpp.
#pragma once

int run_catch_session(int argc, char** argv);
