#include "kernels/io/checksum.h"

#define XXH_INLINE_ALL  // header-only: the checksum's code is compiled here, no library to link
#include <xxhash.h>

#include <zshard/error.h>

namespace zshard {

struct Xxh3Stream::State {
  XXH3_state_t* xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

Xxh3Stream::Xxh3Stream() : state_(std::make_unique<State>()) {
  ZS_CHECK(state_->xxh != nullptr && XXH3_64bits_reset(state_->xxh) == XXH_OK, "cannot start an XXH3 checksum");
}

Xxh3Stream::~Xxh3Stream() = default;

void Xxh3Stream::update(const void* data, size_t bytes) { XXH3_64bits_update(state_->xxh, data, bytes); }

uint64_t Xxh3Stream::digest() const { return XXH3_64bits_digest(state_->xxh); }

}  // namespace zshard
