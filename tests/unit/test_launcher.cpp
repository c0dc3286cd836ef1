// zshard-run's parts that need no job: host lists, hostfiles and Slurm's node lists; the merge of the
// attempts' step logs; the plan that keeps a step's sequences on fewer ranks; the cause read from
// mpirun's stderr; the probes.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include <zshard/error.h>

#include "runtime/elastic/batch_plan.h"
#include "runtime/elastic/hosts.h"
#include "runtime/elastic/hosts.h"
#include "runtime/elastic/run_log.h"
#include "runtime/elastic/supervisor.h"
#include "runtime/process/child_process.h"
#include "shard/memory/estimator.h"
#include "shard/plan_internals.h"
#include "tests/support/test_support.h"

using namespace zshard;
using namespace zshard::elastic;

using test::error_of;
using test::TempDir;

TEST(Hosts, ParsesHostListsWithSlots) {
  EXPECT_EQ(parse_host_list("a:4,b:2"), (std::vector<Host>{{"a", 4}, {"b", 2}}));
  EXPECT_EQ(parse_host_list("node7"), (std::vector<Host>{{"node7", 1}}));
  EXPECT_EQ(host_list_text(parse_host_list("a:4,b")), "a:4,b:1");
  EXPECT_EQ(total_slots(parse_host_list("a:4,b:2,c:1")), 7);
}

TEST(Hosts, RefusesBadHostLists) {
  EXPECT_EQ(error_of([] { parse_host_list("a:2,b:0"); }),
            "--hosts a:2,b:0: host b has 0 slots (every host takes 1 or more ranks)");
  EXPECT_EQ(error_of([] { parse_host_list("a:2,,b:2"); }),
            "--hosts a:2,,b:2: an empty item (want NAME:SLOTS,NAME:SLOTS,...)");
  EXPECT_EQ(error_of([] { parse_host_list("a:2,"); }),
            "--hosts a:2,: an empty item (want NAME:SLOTS,NAME:SLOTS,...)");
  EXPECT_EQ(error_of([] { parse_host_list("a:x"); }),
            "--hosts a:x: bad slot count in 'a:x' (want NAME:SLOTS, SLOTS a whole number)");
  EXPECT_EQ(error_of([] { parse_host_list("a:-1"); }),
            "--hosts a:-1: bad slot count in 'a:-1' (want NAME:SLOTS, SLOTS a whole number)");
  EXPECT_EQ(error_of([] { parse_host_list("a:99999999999"); }),
            "--hosts a:99999999999: bad slot count in 'a:99999999999' (want NAME:SLOTS, SLOTS a whole number)");
  EXPECT_EQ(error_of([] { parse_host_list("a:1,a:2"); }), "--hosts a:1,a:2: host a is named twice");
  EXPECT_EQ(error_of([] { parse_host_list(":2"); }), "--hosts :2: bad host name in ':2'");
}

TEST(Hosts, ReadsOpenMpiHostfiles) {
  const TempDir dir("launcher");
  const std::string path = dir.file("hostfile");
  std::ofstream(path) << "# the rack\na slots=4\nb:2   # a comment\n\n  c\n";
  EXPECT_EQ(read_hostfile(path), (std::vector<Host>{{"a", 4}, {"b", 2}, {"c", 1}}));
  std::ofstream(path) << "a slots=4\nb slots=0\n";
  EXPECT_EQ(error_of([&] { read_hostfile(path); }),
            "--hostfile " + path + ": host b has 0 slots (every host takes 1 or more ranks)");
  std::ofstream(path) << "a slots=4 max_slots=8\nb max-slots=2 slots=2\n";
  EXPECT_EQ(read_hostfile(path), (std::vector<Host>{{"a", 4}, {"b", 2}})) << "max_slots is Open MPI's, not a slot count";
  std::ofstream(path) << "a slots=4 max_slots=2\n";
  EXPECT_EQ(error_of([&] { read_hostfile(path); }), path + ":1: slots=4 exceeds max_slots=2");
  std::ofstream(path) << "a slots=4\nb cpus=2\n";
  EXPECT_EQ(error_of([&] { read_hostfile(path); }), path + ":2: 'cpus=2' is not slots=N or max_slots=N");
  std::ofstream(path) << "# nothing\n";
  EXPECT_EQ(error_of([&] { read_hostfile(path); }), "--hostfile " + path + ": no hosts");
  std::filesystem::remove(path);
  EXPECT_EQ(error_of([&] { read_hostfile(path); }), "--hostfile " + path + ": no such file");
}

TEST(Hosts, ReadsSlurmAllocations) {
  EXPECT_EQ(expand_nodelist("node[01-03,07],gpu5"),
            (std::vector<std::string>{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_nodelist("a[8-11],b"), (std::vector<std::string>{"a8", "a9", "a10", "a11", "b"}));
  EXPECT_EQ(error_of([] { expand_nodelist("host[a-c]"); }), "SLURM_JOB_NODELIST host[a-c]: bad range 'a-c'");
  EXPECT_EQ(error_of([] { expand_nodelist("n[1-2]x"); }), "SLURM_JOB_NODELIST n[1-2]x: text after ']'");
}

TEST(Hosts, ReadsSlurmTaskCounts) {
  EXPECT_EQ(slurm_hosts("n[1-4]", "2(x3),1"), (std::vector<Host>{{"n1", 2}, {"n2", 2}, {"n3", 2}, {"n4", 1}}));
  EXPECT_EQ(slurm_hosts("hosta,hostb", "3,2"), (std::vector<Host>{{"hosta", 3}, {"hostb", 2}}));
  EXPECT_EQ(error_of([] { slurm_hosts("n[1-4]", "2(x3)"); }),
            "SLURM_TASKS_PER_NODE 2(x3) gives 3 node(s), SLURM_JOB_NODELIST n[1-4] 4");
  EXPECT_EQ(error_of([] { slurm_hosts("n[1-2]", "2(x2"); }), "SLURM_TASKS_PER_NODE 2(x2: bad item '2(x2'");
  EXPECT_EQ(error_of([] { slurm_hosts("n[2-1]", "1"); }), "SLURM_JOB_NODELIST n[2-1]: bad range '2-1'");
  EXPECT_EQ(error_of([] { slurm_hosts("n[1-2", "1"); }), "SLURM_JOB_NODELIST n[1-2: '[' without ']'");
}

TEST(RunLog, KeepsTheRecordOfTheAttemptThatCompletedEachStep) {
  RunLog log;
  log.begin_attempt(0);
  for (int s = 1; s <= 5; ++s) log.add({{"step", s}, {"loss", 10.0 - s}, {"attempt", 1}});
  // Killed after step 5; the newest checkpoint is step 4: step 5 is redone, and steps 1-4 stay.
  log.begin_attempt(4);
  EXPECT_EQ(log.last_step(), 4);
  for (int s = 5; s <= 6; ++s) log.add({{"step", s}, {"loss", 10.0 - s}, {"attempt", 2}});
  // Failed again before step 7 was checkpointed... and the relaunch resumed from the same step 6.
  log.begin_attempt(6);
  log.add({{"step", 7}, {"loss", 3.0}, {"attempt", 3}});
  std::istringstream lines(log.text());
  std::string line;
  std::vector<std::pair<int, int>> step_attempt;
  while (std::getline(lines, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    step_attempt.emplace_back(j["step"], j["attempt"]);
  }
  EXPECT_EQ(step_attempt, (std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 2}, {6, 2}, {7, 3}}));
}

TEST(RunLog, ReadsWholeLinesOfAGrowingStepLog) {
  const TempDir dir("launcher");
  const std::string path = dir.file("steps.jsonl");
  StepLogReader reader(path);
  EXPECT_TRUE(reader.read_new().empty());  // not there yet
  std::ofstream out(path);
  out << "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"lo" << std::flush;  // step 2 being written
  std::vector<nlohmann::json> got = reader.read_new();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["step"], 1);
  out << "ss\":2.25}\n" << std::flush;
  got = reader.read_new();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]["loss"], 2.25);
  EXPECT_TRUE(reader.read_new().empty());
  out << "not json\n" << std::flush;
  EXPECT_THROW(reader.read_new(), Error);
}

TEST(BatchPlan, KeepsTheStepAndRaisesGradAccumOnlyWhereTheMicroBatchDoesNotFit) {
  const TrainingRun run = read_training_flags({"zshard-train", "--model", "tiny", "--strategy", "hybrid", "--batch",
                                               "12", "--seq", "32", "--unknown-flag-of-a-program", "x"});
  ASSERT_TRUE(run.model);
  const std::vector<int> six = {2, 2, 2}, four = {2, 2};
  const int64_t two_per_rank = estimate_rank_bytes(run, four, 8, 1);
  const int64_t three_per_rank = estimate_rank_bytes(run, four, 12, 1);
  ASSERT_LT(two_per_rank, three_per_rank);
  // 6 ranks take 2 sequences each: the command as it is.
  BatchPlan p = plan_batch(run, six, two_per_rank + 200000);
  EXPECT_EQ(p.batch, 12);
  EXPECT_EQ(p.grad_accum, 1);
  EXPECT_TRUE(p.fits);
  // 4 ranks would take 3: the step becomes 2 micro-steps of 6 (2 a rank).
  p = plan_batch(run, four, two_per_rank + 200000);
  EXPECT_EQ(p.batch, 6);
  EXPECT_EQ(p.grad_accum, 2);
  EXPECT_LE(p.rank_bytes, two_per_rank + 200000);
  // Room for 3 a rank: unchanged.
  p = plan_batch(run, four, three_per_rank);
  EXPECT_EQ(p.batch, 12);
  EXPECT_EQ(p.grad_accum, 1);
  // Nothing fits: the smallest micro-batch that leaves every rank a sequence (4 = 12 / 3), flagged.
  p = plan_batch(run, four, 1);
  EXPECT_EQ(p.batch, 4);
  EXPECT_EQ(p.grad_accum, 3);
  EXPECT_FALSE(p.fits);
}

// Periodic asynchronous saves hold a snapshot beside the batch, which the job's own memory check counts:
// the plan counts it too, and a budget that fits the micro-batch without it then raises --grad-accum.
TEST(BatchPlan, CountsTheSnapshotOfAsynchronousSaves) {
  const std::vector<std::string> command = {"zshard-train", "--model", "tiny", "--strategy", "zero2", "--batch", "12",
                                            "--seq", "32", "--save-dir", "ck", "--save-every", "2"};
  std::vector<std::string> sync_command = command;
  sync_command.insert(sync_command.end(), {"--save-mode", "sync"});
  const TrainingRun async = read_training_flags(command), sync = read_training_flags(sync_command);
  ASSERT_TRUE(async.model && sync.model);
  const std::vector<int> four = {2, 2};
  EstimateInput in;
  in.model = async.model.get();
  in.plan = plan_on_hosts(async.options.plan, four);
  in.group = 0;
  in.checkpoint_snapshot = true;
  const int64_t snapshot = estimate_memory(in).checkpoint_snapshot;
  ASSERT_GT(snapshot, 0);
  EXPECT_EQ(estimate_rank_bytes(async, four, 12, 1), estimate_rank_bytes(sync, four, 12, 1) + snapshot);
  const int64_t sync_bytes = estimate_rank_bytes(sync, four, 12, 1);
  EXPECT_EQ(plan_batch(sync, four, sync_bytes).grad_accum, 1);
  EXPECT_GT(plan_batch(async, four, sync_bytes).grad_accum, 1) << "the snapshot was left out of the plan";
}

TEST(BatchPlan, RefusesTrainingCommandsItCannotRead) {
  EXPECT_EQ(error_of([] { read_training_flags({"zshard-train", "--batch", "x"}); }),
            "the training command: --batch: expected a number of sequences or auto, got 'x'");
  // A model the registry does not know (a program of one's own): no estimate, the command's batch.
  const TrainingRun run = read_training_flags({"my-train", "--model", "mine", "--batch", "12"});
  EXPECT_FALSE(run.model);
  const BatchPlan p = plan_batch(run, {2}, 1);
  EXPECT_EQ(p.batch, 12);
  EXPECT_EQ(p.grad_accum, 1);
}

TEST(Supervisor, RewritesTheTrainingCommandsFlags) {
  std::vector<std::string> cmd = {"zshard-train", "--batch", "12", "--log-json=x.json", "--steps", "5", "--batch=3"};
  set_flag(cmd, "--batch", "6");
  set_flag(cmd, "--log-json", nullptr);
  EXPECT_EQ(cmd, (std::vector<std::string>{"zshard-train", "--steps", "5", "--batch", "6"}));
}

TEST(Supervisor, NamesTheCauseOfAFailure) {
  EXPECT_EQ(failure_cause({"step 3/10 ...", "zshard-train: rank 2: all_gather of unit 3 timed out after 5 s",
                           "MPI_ABORT was invoked on rank 2"},
                          1),
            "zshard-train: rank 2: all_gather of unit 3 timed out after 5 s");
  EXPECT_EQ(failure_cause({"mpirun noticed that process rank 3 with PID 12 on node hostb exited on signal 9 (Killed)."},
                          137),
            "mpirun noticed that process rank 3 with PID 12 on node hostb exited on signal 9 (Killed).");
  EXPECT_EQ(failure_cause({"/usr/bin/mpiexec: Error: unknown option \"--bogus\"", "Type 'mpirun --help' for usage."}, 1),
            "/usr/bin/mpiexec: Error: unknown option \"--bogus\"");
  EXPECT_TRUE(launcher_refusal("mpirun: Error: unknown option \"--bogus\""));
  EXPECT_FALSE(launcher_refusal("zshard-train: Error: something of the job's own"));
  EXPECT_EQ(failure_cause({"-----", "ORTE was unable to reliably start one or more daemons."}, 9),
            "mpirun lost a host's daemon (ORTE was unable to reliably start one or more daemons.)");
  EXPECT_EQ(failure_cause({"------", "The specified binding policy is not recognized:", "", "  Policy: nonsense",
                           "------"},
                          1),
            "mpirun: The specified binding policy is not recognized:");
  EXPECT_EQ(failure_cause({"------", "Both the -x method and", "  mca_base_env_list were given", "", "------"}, 1),
            "mpirun: Both the -x method and mca_base_env_list were given");
  // The frames Open MPI 4.1 adds for any rank that exits non-zero say no more than the status.
  EXPECT_EQ(failure_cause({"------", "Primary job  terminated normally, but 1 process returned",
                           "a non-zero exit code. Per user-direction, the job has been aborted.", "------",
                           "------",
                           "mpirun detected that one or more processes exited with non-zero status, thus causing",
                           "the job to be terminated. The first process to do so was:", "",
                           "  Process name: [[1234,1],0]", "  Exit code:    1", "------"},
                          1),
            "mpirun exited with status 1");
  // A closing rule followed by text is not a frame.
  EXPECT_EQ(failure_cause({"------", "Primary job  terminated normally", "------", "a rank's stray line"}, 1),
            "mpirun exited with status 1");
  EXPECT_EQ(failure_cause({"nothing useful"}, 3), "mpirun exited with status 3");
}

TEST(Probe, AsksEveryHostAtOnceAndGivesUpAtTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  // $1 is the host: "up" answers, "down" fails, "hung" never answers.
  const std::vector<bool> up = probe_hosts({"up", "down", "hung", "localhost"},
                                           "case $1 in up) exit 0 ;; down) exit 1 ;; *) sleep 30 ;; esac", 1.0);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(up, (std::vector<bool>{true, false, false, true}));
  EXPECT_LT(took, 10.0);
}
