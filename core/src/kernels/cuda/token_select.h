// Token selection on the GPU: verification of speculative drafts, plain sampling and the drafters' sampling, with the
// semantics of kernels/cpu/token_select.h (which defines the argument structs; every pointer in them is device memory
// here), so no full-vocabulary row of logits ever crosses to the host.
//
// Both calls launch a fixed number of kernels whatever the batch (select_tokens two, sample_drafts one), allocate
// nothing and never wait for the host, so they can be captured in a CUDA graph; outputs are bit-for-bit reproducible.
// Each row is handled by a cluster of thread blocks (sm_90) that split the vocabulary and combine their partial results
// through distributed shared memory in a fixed order. Against the CPU reference, a token or an accept decision can
// differ only where a uniform lands within rounding (about 1e-7 relative) of a boundary: the sums run in another order,
// the device's exp may differ from the host's in the last bit, and the top-p mass is summed in 2^-k fixed point.
//
// What the device cannot report, it contains: a sequence whose num_drafts exceeds max_drafts is treated as having
// max_drafts, and draft or q ids outside [0, vocab) are never read as rows of logits (such a draft is rejected).
// Repeated q ids, uniforms outside [0, 1) or a null `uniforms` with sampled sequences are the caller's error (the CPU
// reference rejects them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/token_select.h"
#include "kernels/cuda/stream_handle.h"
#include "kiln/status.h"

namespace kiln::cuda {

// Bytes of workspace select_tokens needs for up to max_seqs sequences of up to max_drafts drafts each.
size_t select_workspace_bytes(int64_t max_seqs, int64_t max_drafts);

// workspace: device memory of at least select_workspace_bytes(args.num_seqs, args.max_drafts) bytes, 8-byte aligned.
Status select_tokens(const cpu::SelectArgs& args, void* workspace, size_t workspace_bytes, StreamHandle stream);

// Needs no workspace: the candidates of a row are gathered in shared memory.
Status sample_drafts(const cpu::DraftSampleArgs& args, StreamHandle stream);

}  // namespace kiln::cuda
