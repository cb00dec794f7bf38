// The handoff of one request's token events from the engine thread to the HTTP thread that writes them.
// The engine's sink only appends under a mutex (never blocks on the network); the HTTP thread waits on it.
// When the client has gone, close() makes the sink return false so the engine frees the sequence at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/engine_api.h"

namespace kiln {

class RequestStream : public std::enable_shared_from_this<RequestStream> {
 public:
  // The sink keeps the stream alive for as long as the engine holds it.
  TokenSink make_sink();

  // Events received since the last call; waits up to `timeout` when there are none.
  std::vector<TokenEvent> wait(std::chrono::milliseconds timeout);
  void close();
  bool closed() const;

 private:
  bool push(const TokenEvent& event);

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<TokenEvent> events_;
  bool closed_ = false;
};

}  // namespace kiln
