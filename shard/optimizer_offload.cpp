#include "shard/optimizer_offload.h"

#include <algorithm>
#include <exception>
#include <thread>

#include <zshard/error.h>

#include "comm/launch.h"
#include "kernels/engine_ops.h"
#include "kernels/test_hooks.h"

namespace zshard {

namespace {

// Runs the pieces, in order, cut into `threads` contiguous runs of about equal elements. The work is
// elementwise, so any cut gives the same bits.
void run_pieces(const std::vector<AdamWPiece>& pieces, int threads) {
  size_t total = 0;
  for (const AdamWPiece& piece : pieces) total += piece.n;
  const size_t per_thread = (total + size_t(threads) - 1) / size_t(std::max(threads, 1));
  const auto run_range = [&](size_t lo, size_t hi) {  // global element range [lo, hi)
    size_t start = 0;
    for (const AdamWPiece& piece : pieces) {
      const size_t b = std::max(lo, start), e = std::min(hi, start + piece.n);
      if (b < e) piece.run(b - start, e - b);
      start += piece.n;
    }
  };
  if (threads <= 1 || total == 0) return run_range(0, total);
  // A worker's error is rethrown here, after every worker has joined.
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t)
    workers.emplace_back([&, t] {
      try {
        run_range(std::min(total, t * per_thread), std::min(total, (t + 1) * per_thread));
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  try {
    run_range(0, std::min(total, per_thread));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (std::thread& w : workers) w.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

// Whether the host gradients are buffers of their own: always on a device; on the cpu with bf16 parameters,
// since AdamW writes the bf16 copy over them, which would overwrite the owned gradients themselves. Test
// hook: ZSHARD_TEST_OFFLOAD_COPIES=1 gives them buffers of their own on the cpu in fp32 too. The cpu then
// copies each unit's gradients when its reduction lands, as a GPU does, so that a copy taken before the
// gradients are final, or AdamW reading the wrong buffer, changes the results of the cpu tests.
bool own_host_grads(Device device, DType compute) {
  return device != Device::cpu || compute != DType::f32 || test_hooks().offload_copies;
}

// This rank's share of the host's hardware threads (ranks on one host share its cores), at least 1.
int host_threads() {
  const int cores = int(std::thread::hardware_concurrency());
  return std::max(1, cores / std::max(1, comm::ranks_on_this_host()));
}

}  // namespace

OptimizerOffload::OptimizerOffload(Device device, std::vector<UnitBuffers> units) : device_(device) {
  for (UnitBuffers& buffers : units) {
    Unit u;
    static_cast<UnitBuffers&>(u) = std::move(buffers);
    ZS_CHECK(u.master.device() == Device::cpu && u.master.dtype() == DType::f32 &&
                 u.grads.numel() == u.master.numel() && u.compute.numel() == u.master.numel(),
             "the offloaded optimizer steps an fp32 host master as large as the owned gradients and parameters");
    // Where host and device memory are the same, the owned gradients are already where AdamW reads them.
    u.host_grads = own_host_grads(device, u.compute.dtype())
                       ? Tensor::empty(u.grads.shape(), u.grads.dtype(), Device::cpu, Category::host)
                       : u.grads;
    units_.push_back(std::move(u));
  }
  copies_ = CopyStream::make(device, int(units_.size()) + 1);
}

void OptimizerOffload::grads_landed(int unit) {
  Unit& u = units_[size_t(unit)];
  copies_->follow_compute();  // after the reduction's landing, queued on the compute stream
  copies_->copy(u.host_grads.raw(), Device::cpu, u.grads.raw(), device_, u.grads.nbytes());
  copies_->set_mark(unit);
  if (!u.landed) landed_order_.push_back(unit);
  u.landed = true;
}

void OptimizerOffload::queue_upload(const Unit& u) {
  // The fp32 compute copy is the master's values; a bf16 one was written by AdamW (or by upload()) over the
  // host gradients.
  const Tensor& source = u.compute.dtype() == DType::f32 ? u.master : u.host_grads;
  copies_->copy(u.compute.raw(), device_, source.raw(), Device::cpu, u.compute.nbytes());
}

void OptimizerOffload::step(const std::function<std::vector<AdamWPiece>(int unit)>& pieces) {
  // Units that no reduction reached this step (the model left them out) have their gradients copied now.
  for (int i = 0; i < int(units_.size()); ++i)
    if (!units_[size_t(i)].landed) grads_landed(i);
  // The uploads overwrite the compute copy: after everything the compute stream queued that reads it.
  copies_->follow_compute();
  const int threads = host_threads();
  for (int i : landed_order_) {
    Unit& u = units_[size_t(i)];
    copies_->host_waits(i);
    run_pieces(pieces(i), threads);
    queue_upload(u);
    u.landed = false;
  }
  landed_order_.clear();
  const int all = int(units_.size());
  copies_->set_mark(all);
  copies_->compute_waits(all);
}

void OptimizerOffload::drop_gradients() {
  for (int i : landed_order_) {
    copies_->host_waits(i);
    units_[size_t(i)].landed = false;
  }
  landed_order_.clear();
}

void OptimizerOffload::upload(int unit) {
  Unit& u = units_[size_t(unit)];
  ZS_CHECK(!u.landed, "the parameters of a unit whose gradients are on their way to the host cannot be replaced");
  if (u.compute.dtype() != DType::f32)
    ops::convert(Device::cpu, u.host_grads.raw(), u.compute.dtype(), u.master.raw(), DType::f32,
                 size_t(u.master.numel()));
  copies_->follow_compute();
  queue_upload(u);
  // Set-up and loading only: waiting here keeps the host buffer free for the next unit's conversion.
  copies_->set_mark(unit);
  copies_->host_waits(unit);
}

}  // namespace zshard
