// Decode-context parallelism (parallel.decode_context = D): the KV cache split by token over D ranks, the fact sheet's
// layout with interleave 1 (the one the DSA indexer needs). Token position p lives on rank p mod D, as that rank's
// local token k = p div D; a rank stores and reads only its own tokens' latent / rope rows and indexer keys.
//
// Addressing. A KV page (the layout's geometry().block_size = kv.block_size tokens, P) holds one rank's tokens. The
// scheduler hands out blocks of P·D tokens (scheduler_block_size): engine block b is, on rank d, that rank's page
// b·D + d, which holds its local tokens of positions [b·P·D, (b+1)·P·D). Every rank sees the same block table, and
// a rank's local table (pages b·D + d) is an ordinary table of P-token pages over its local tokens, so the KV layout
// appends, gathers and attends over it unchanged.
//
// Memory. Page b·D + d is the d-th P-row slice of engine block b's memory, so where ranks have memory of their own
// (one GPU each) rank d allocates only its pages: the pool's bytes per rank hold D times the tokens. CPU ranks are
// threads of one process sharing one pool of all D ranks' pages; each rank's rows sit in its own pages (a 1/D share
// of the pool), and with tensor > D the ranks of later decode-context groups read the first group's pages (one
// copy per process, as one copy serves every tensor-parallel rank without DCP).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln {

struct DecodeContextShard {
  int rank = 0;   // this rank's place in its decode-context group
  int world = 1;  // D

  bool split() const { return world > 1; }
  // The scheduler's blocks must hold one page (`page` tokens, the layout's) per rank: page · world tokens.
  Status check_block_size(int64_t block_size, int64_t page) const {
    if (!split() || block_size == page * world) return ok_status();
    return failed_precondition("parallel.decode_context = " + std::to_string(world) +
                               ": the scheduler's blocks must hold kv.block_size × decode_context = " +
                               std::to_string(page * world) + " tokens (one page per rank), got " +
                               std::to_string(block_size));
  }
  bool owns(int64_t pos) const { return pos % world == rank; }
  // The global position of local token k of rank r.
  int64_t position(int64_t local, int r) const { return local * world + r; }
  // How many of positions [0, len) rank r owns.
  int64_t local_count(int64_t len, int r) const { return len > r ? (len - r + world - 1) / world : 0; }
  int64_t local_count(int64_t len) const { return local_count(len, rank); }
  // The cache slot of a position this rank owns in the pool every rank shares (CPU ranks), from the sequence's
  // (scheduler) block table; −1 for a position it does not own (nothing is stored for it here). `page` is the
  // layout's page size P.
  int64_t slot(const std::vector<int32_t>& table, int64_t page, int64_t pos) const {
    if (!owns(pos)) return -1;
    const int64_t k = pos / world;
    return (static_cast<int64_t>(table[k / page]) * world + rank) * page + k % page;
  }
  // The slot of a position this rank owns in a pool of its own (a GPU rank: it allocates only its page of each
  // scheduler block, so engine block b is its page b); −1 for a position it does not own.
  int64_t own_pool_slot(const std::vector<int32_t>& table, int64_t page, int64_t pos) const {
    if (!owns(pos)) return -1;
    const int64_t k = pos / world;
    return static_cast<int64_t>(table[k / page]) * page + k % page;
  }
  // This rank's pages as a block table over its local tokens (pages of P rows).
  std::vector<int32_t> local_table(const std::vector<int32_t>& table) const {
    std::vector<int32_t> local(table.size());
    for (size_t i = 0; i < table.size(); ++i) local[i] = table[i] * world + rank;
    return local;
  }
};

}  // namespace kiln
