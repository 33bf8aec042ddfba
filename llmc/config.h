// config.h: the run configuration, in three parts: config/run_config.h (RunConfig), config/options.h
// (every flag, its default and its documentation in one table: the command line, --config files,
// --help) and config/resolve.h (the checks and what a resolved config derives). Including this
// header includes them all; a header that needs only RunConfig includes config/run_config.h.
#pragma once

#include "llmc/config/options.h"
#include "llmc/config/resolve.h"
#include "llmc/config/run_config.h"
