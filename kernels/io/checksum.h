// XXH3-64 over a stream of bytes: a checkpoint's rank files are checksummed with it as they are written,
// and again when a load verifies them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace zshard {

class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void update(const void* data, size_t bytes);
  // The checksum of every byte given so far; more may follow.
  uint64_t digest() const;

 private:
  struct State;  // xxHash's state, kept out of this header (xxhash.h is compiled into one file only)
  std::unique_ptr<State> state_;
};

}  // namespace zshard
