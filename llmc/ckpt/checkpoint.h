// ckpt/checkpoint.h: sharded checkpoints: written in the background, verified, resumed on any
// world size and ZeRO stage.
//
// A checkpoint is a directory <output_dir>/ckpt_<step, 8 digits>/ holding
//   rank_<rank, 5 digits>.bin  every rank's part of the training state (ShardedState's snapshot,
//                              less the copies that another rank's file holds: each element once)
//   manifest.json              what every file holds, its size and CRC32C, and the run's state
//                              (step, data position, random states, config): manifest.h
//   COMPLETE                   written last, by rank 0, once every rank's file is durable; it holds
//                              the manifest's CRC32C. A directory without it does not exist for resume.
// Every file is written under a temporary name, fsynced and renamed, and the directory fsynced, so a
// crash at any moment leaves either the previous state or the new one.
//
// Writing (CheckpointWriter). After an optimizer step the trainer calls save(): the model starts
// copying its state into host memory (a side stream on the GPU, a thread on the CPU) and the
// trainer goes straight on with the next forward and backward, which do not change the state; only
// the next optimizer update waits for the copy (before_update). A background thread then checksums
// and writes the rank's file and, on a communicator of its own, learns every rank's outcome; rank 0
// writes the manifest and the marker, or removes the directory if any rank failed, and prunes old
// checkpoints. One checkpoint is in flight at most: a save() that finds the previous one still
// writing waits for it, and says so. --ckpt-sync does everything on the training thread instead.
//
// Resuming (find_resume_checkpoint, load_checkpoint). Candidates newest first; each rank checks the
// marker and manifest and the CRC32C of a share of the files, and the ranks agree: a directory with
// any problem is reported (which file, expected and found) and the next older one is tried. Each
// rank then reads the ranges it now holds from whichever files hold them (manifest.h's slices), so
// the world size and ZeRO stage may differ from the run that wrote it.
//
// The parts: files.h (names, durable writes), tiers.h (shared and local tiers, replicas between
// nodes), writer.h (CheckpointWriter), reader.h (CheckpointReader), resume.h (find_resume_checkpoint,
// check_resume_compatible, load_checkpoint). Including this header includes them all.
#pragma once

#include "llmc/ckpt/files.h"
#include "llmc/ckpt/reader.h"
#include "llmc/ckpt/resume.h"
#include "llmc/ckpt/tiers.h"
#include "llmc/ckpt/writer.h"
