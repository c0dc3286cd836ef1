// A training loop of one's own around zshard's engine, through the public headers alone: the data (a file's
// bytes), the schedule, evaluation and checkpoints are the loop's, the sharding is the engine's. E.g.
//   mpirun -np 4 own_loop --strategy zero3 --data corpus.txt --steps 40 --stop-after 20 --save ck; then --resume ck
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <zshard/engine.h>
#include <zshard/lr_schedule.h>
#include <zshard/model_registry.h>
#include <zshard/world.h>

using zshard::refuse;  // a bad option: every rank reads the same ones and refuses them alike (exit 2)

int main(int argc, char** argv) {
  zshard::World world(&argc, &argv);
  const int rank = world.rank(), ranks = world.size();
  try {
    std::map<std::string, std::string> args = {{"--strategy", "ddp"}, {"--data", ""}, {"--steps", "20"},
        {"--batch", "8"}, {"--seq", "32"}, {"--lr", "0.003"}, {"--warmup", "5"}, {"--init-from", ""},
        {"--save", ""}, {"--resume", ""}, {"--stop-after", "0"}};  // the last step this run takes (0: --steps)
    for (int i = 1; i < argc; i += 2) {
      if (!args.count(argv[i])) refuse(argv[i], ": unknown option");
      if (i + 1 == argc) refuse(argv[i], ": needs a value");
      args[argv[i]] = argv[i + 1];
    }
    const auto number = [&]<class Number>(const std::string& name, Number least) {
      const std::string& text = args[name];
      Number value{};
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(double(value)) || value < least)
        refuse(name, ": '", text, "' is not ", std::is_integral_v<Number> ? "an integer" : "a number", " >= ", least);
      return value;
    };
    for (const std::string name : {"--data", "--init-from"})  // read whole: a directory cannot be, a FIFO may never end
      if (std::error_code ec; !args[name].empty() && !std::filesystem::is_regular_file(args[name], ec))
        refuse(name, ": '", args[name], "' is not a regular file");
    const std::string &init_from = args["--init-from"], &resume = args["--resume"], &save = args["--save"];
    const int B = number("--batch", 1), T = number("--seq", 1), steps = number("--steps", 0);
    const int stop_after = number("--stop-after", 0), stop = stop_after ? std::min(steps, stop_after) : steps;
    const zshard::LrSchedule lr{.lr = number("--lr", 0.0f), .warmup = number("--warmup", 0), .total_steps = steps};
    if (B < ranks)
      refuse("--batch ", B, " is smaller than the world size ", ranks, ": every rank needs at least one sequence");
    std::ifstream data(args["--data"], std::ios::binary);  // bytes, 0..255: the tiny model's vocabulary
    const std::vector<uint8_t> bytes(std::istreambuf_iterator<char>(data), std::istreambuf_iterator<char>{});
    if (bytes.empty()) refuse("--data: '", args["--data"], "' is empty");
    if (!save.empty() && std::filesystem::exists(save + "/manifest.json"))  // save_async's refusal, before training
      refuse("--save: '", save, "' holds a checkpoint already");
    const auto model = zshard::build_model("tiny", zshard::model_config("tiny"));
    const auto plan = zshard::resolve_plan({.strategy = {zshard::parse_strategy(args["--strategy"])}}, world.comm());
    // zshard-train's --attention auto: fused where it runs on the plan's device and dtype, else blocks.
    zshard::choose_attention(*model, zshard::AttentionKernel::automatic, plan.placement.device,
                             plan.placement.param_dtype);
    zshard::Engine engine(*model, world.comm(), plan, {.tokens_per_step = int64_t(B) * T});
    if (!init_from.empty()) engine.import_weights(init_from);  // Hugging Face's names
    const int at = resume.empty() ? 0 : engine.load(resume).step;  // a checkpoint of any world size
    if (!resume.empty() && at >= stop && rank == 0)
      std::printf("own_loop: %s is at step %d, the last is %d: nothing to train\n", resume.c_str(), at, stop);
    // Sequence k of step s's batch starts at byte (s * B + k) * T; this rank takes `mine` from the `first` on.
    const int mine = B / ranks + (rank < B % ranks), first = rank * (B / ranks) + std::min(rank, B % ranks);
    std::vector<int32_t> window(size_t(mine) * T + 1);  // their bytes, and the one after: the last target
    const auto batch = [&](int64_t step) {
      for (size_t i = 0; i < window.size(); ++i)
        window[i] = bytes[size_t(((step * B + first) * T + int64_t(i)) % int64_t(bytes.size()))];
      return zshard::Batch{window.data(), window.data() + 1, mine, T};
    };
    for (int step = engine.steps_done(); step < stop; ++step) {
      engine.forward_backward(batch(step));
      const zshard::StepStats done = engine.step({.lr = lr.at(step)});  // the global loss and norm
      if (rank == 0) std::printf("step %d loss %.9f norm %.6f\n", step + 1, done.loss, done.grad_norm);
    }
    auto saving = save.empty() ? std::optional<zshard::AsyncSave>() : engine.save_async(save);  // while evaluating
    for (int k = 0; k < 2; ++k) engine.forward(batch(steps + k));  // the two batches after the last step's
    if (const double loss = engine.finish_eval(); rank == 0) std::printf("eval %.6f\n", loss);
    if (saving) saving->wait();
  } catch (const zshard::AgreedFailure& e) {  // every rank alike: the failing rank's line, the agreed code
    if (e.report()) std::fprintf(stderr, "own_loop: error: %s\n", e.what());
    return e.exit_code();
  } catch (const zshard::UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "own_loop: error: %s\n", e.what());
    return 2;
  } catch (const zshard::Error& e) {  // anything else may leave a peer waiting: end the whole job
    std::fprintf(stderr, "own_loop: rank %d: %s\n", rank, e.what());
    zshard::World::abort(1);
  }
}
