// A training loop of one's own, with zshard's engine doing the sharding: the user's data source (a text
// file read as bytes), learning-rate schedule (linear warmup, cosine decay), evaluation, checkpoint and
// resume on another world size. Everything else is the public API: <zshard/engine.h>, <zshard/world.h>.
//
//   mpirun -np 4 own_loop --strategy zero3 --data corpus.txt --steps 40 --stop-after 20 --save ck
//   mpirun -np 3 own_loop --strategy zero2 --data corpus.txt --steps 40 --resume ck
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include <zshard/engine.h>
#include <zshard/model_registry.h>
#include <zshard/world.h>

namespace {

// --name value pairs over the defaults. An unknown name, a name without a value, and a number that does
// not parse or is out of range throw zshard::UsageError: every rank reads the same arguments and refuses
// them alike. (The files are checked on each rank: on a shared file system they agree too.)
struct Args {
  std::map<std::string, std::string> values = {
      {"--strategy", "ddp"}, {"--data", ""},   {"--steps", "20"}, {"--batch", "8"},   {"--seq", "32"},
      {"--lr", "0.003"},     {"--warmup", "5"}, {"--save", ""},   {"--resume", ""},   {"--eval-every", "10"},
      {"--stop-after", "0"}};  // steps this run takes, of --steps (0: all)

  Args(int argc, char** argv) {
    for (int i = 1; i < argc; i += 2) {
      if (!values.count(argv[i])) zshard::refuse(argv[i], ": unknown option");
      if (i + 1 == argc) zshard::refuse(argv[i], ": needs a value");
      values[argv[i]] = argv[i + 1];
    }
  }
  std::string str(const std::string& name) const { return values.at(name); }
  int num(const std::string& name, int at_least) const {
    const std::string& text = values.at(name);
    int value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || value < at_least)
      zshard::refuse(name, ": '", text, "' is not an integer >= ", at_least);
    return value;
  }
  float real(const std::string& name) const {
    const std::string& text = values.at(name);
    char* end = nullptr;
    const float value = std::strtof(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !std::isfinite(value) || value < 0)
      zshard::refuse(name, ": '", text, "' is not a number >= 0");
    return value;
  }
};

// Sequence k of the global micro-batch s starts at token (s * batch + k) * seq, wrapping around the file;
// each rank reads its own `count` sequences from `first` on. The targets are the next tokens.
struct TextData {
  std::vector<int32_t> tokens;
  void fill(int64_t step, int batch, int seq, int first, int count, int32_t* inputs, int32_t* targets) const {
    const int64_t n = int64_t(tokens.size());
    for (int k = 0; k < count; ++k)
      for (int j = 0; j < seq; ++j) {
        const int64_t at = ((step * batch + first + k) * seq + j) % n;
        inputs[k * seq + j] = tokens[size_t(at)];
        targets[k * seq + j] = tokens[size_t((at + 1) % n)];
      }
  }
};

float learning_rate(int step, int steps, int warmup, float peak) {
  if (step < warmup) return peak * float(step + 1) / float(warmup);
  const double progress = std::min(1.0, double(step - warmup) / std::max(steps - warmup, 1));
  return float(0.5 * peak * (1.0 + std::cos(std::numbers::pi * progress)));
}

}  // namespace

int main(int argc, char** argv) {
  zshard::World world(&argc, &argv);
  try {
    const Args args(argc, argv);
    const int B = args.num("--batch", 1), T = args.num("--seq", 1), steps = args.num("--steps", 0);
    const int warmup = args.num("--warmup", 0), eval_every = args.num("--eval-every", 1);
    const float peak_lr = args.real("--lr");
    std::ifstream file(args.str("--data"), std::ios::binary);
    if (!file) zshard::refuse("--data: cannot open '", args.str("--data"), "'");
    const TextData data{{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()}};
    if (data.tokens.empty()) zshard::refuse("--data: '", args.str("--data"), "' is empty");
    // Engine::save refuses a committed checkpoint's directory: found now, not after the training.
    const std::string save = args.str("--save");
    if (!save.empty() && std::filesystem::exists(std::filesystem::path(save) / "manifest.json"))
      zshard::refuse("--save: '", save, "' holds a checkpoint already");

    const std::unique_ptr<zshard::Model> model = zshard::build_model("tiny", zshard::model_config("tiny"));
    zshard::PlanOptions options;
    options.strategy.kind = zshard::parse_strategy(args.str("--strategy"));
    const zshard::ShardPlan plan = zshard::resolve_plan(options, world.comm());
    zshard::Engine engine(*model, world.comm(), plan, {.seed = 1337, .grad_accum = 1, .tokens_per_step = int64_t(B) * T});
    if (!args.str("--resume").empty()) engine.load(args.str("--resume"));

    // This rank's share of each batch: an even split, the remainder on the first ranks.
    const int rank = world.rank(), ranks = world.size();
    const int mine = B / ranks + (rank < B % ranks), first = rank * (B / ranks) + std::min(rank, B % ranks);
    std::vector<int32_t> inputs(size_t(mine) * T), targets(inputs.size());
    const auto global_sum = [&](double value) {
      world.comm().all_reduce(&value, 1, zshard::DType::f64, zshard::comm::ReduceOp::sum)->wait();
      return value;
    };
    const int stop_after = args.num("--stop-after", 0), stop = stop_after > 0 ? std::min(steps, stop_after) : steps;
    for (int step = engine.steps_done(); step < stop; ++step) {
      data.fill(step, B, T, first, mine, inputs.data(), targets.data());
      const double loss = global_sum(engine.forward_backward({inputs.data(), targets.data(), mine, T})) / (B * T);
      const double norm = engine.step({.lr = learning_rate(step, steps, warmup, peak_lr)});
      if (rank == 0) std::printf("step %d loss %.9f norm %.6f\n", step + 1, loss, norm);
      if ((step + 1) % eval_every == 0) {  // the loss on the batches after the last step's
        double sum = 0;
        for (int k = 0; k < 2; ++k) {
          data.fill(steps + k, B, T, first, mine, inputs.data(), targets.data());
          sum += engine.forward({inputs.data(), targets.data(), mine, T});
        }
        if (const double eval = global_sum(sum) / (2.0 * B * T); rank == 0) std::printf("eval %d %.6f\n", step + 1, eval);
      }
    }
    if (!save.empty()) engine.save(save);
  } catch (const zshard::UsageError& e) {
    // Bad options fail alike on every rank: one line says so.
    if (world.rank() == 0) std::fprintf(stderr, "own_loop: error: %s\n", e.what());
    return 2;
  } catch (const zshard::Error& e) {
    // Anything else may leave a peer waiting: end the whole job.
    std::fprintf(stderr, "own_loop: rank %d: %s\n", world.rank(), e.what());
    zshard::World::abort(1);
  }
  return 0;
}
