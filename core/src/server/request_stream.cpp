#include "server/request_stream.h"

namespace kiln {

TokenSink RequestStream::make_sink() {
  return [self = shared_from_this()](const TokenEvent& event) { return self->push(event); };
}

bool RequestStream::push(const TokenEvent& event) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    events_.push_back(event);
  }
  ready_.notify_one();
  return true;
}

std::vector<TokenEvent> RequestStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !events_.empty() || closed_; });
  std::vector<TokenEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

void RequestStream::close() {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    events_.clear();
  }
  ready_.notify_all();
}

bool RequestStream::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

}  // namespace kiln
