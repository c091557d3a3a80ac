// Standalone driver (no torch, no Python) for the kernel's step engine (csrc/kernel/step_engine.h):
// steps planned and moved on the engine's threads and inline, 0-3 submitted ahead, against a
// reference that counts each row's training; batch problems and the split of a batch by
// table; a prefetched batch compared with the one taken; a failed move, a failed hook and a
// failed fault point failing their step and every later one; Shutdown with a plan held and
// steps queued; WaitForMoves from a plan hook; write guards; dirty bitmaps; a virtual table;
// counters read while steps run. Every wait is on an event or a counter, never on a sleep or a timeout.
// Run plain, under ASan/UBSan and TSan, and through the thread-safety analysis by
// scripts/sanitize.sh.
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/step_engine_harness.h"

namespace mtrains {
namespace testing {
namespace {

// ---------------------------------------------------------------------------------------------
// The pipeline against the reference, counters read beside it.

struct PipelineResult {
  std::vector<std::vector<int64_t>> remapped;  // each step's slots
  uint64_t overflow_rows = 0, evictions = 0, written_back = 0, counter_reads = 0;
};

// Reads every counter until `stop` (TSan checks the locking): each grows, and pending and in
// flight never exceed what the driver submits ahead.
void ReadCounters(StepEngine* e, size_t most_pending, const std::atomic<bool>* stop, uint64_t* reads) {
  uint64_t steps = 0, written = 0;
  do {
    const EngineCounters c = e->counters();
    CHECK(c.steps >= steps && c.rows_written_back >= written);
    steps = c.steps;
    written = c.rows_written_back;
    uint64_t tables_written = 0;
    for (size_t t = 0; t < kTables; ++t) tables_written += e->table_counters(t).rows_written_back;
    CHECK(tables_written >= written) << tables_written << " < " << written;
    const size_t pending = e->pending(), in_flight = e->InFlight();
    CHECK(pending <= most_pending && in_flight <= most_pending) << pending << " " << in_flight;
    CHECK(e->last_taken_step() >= -1);
    CHECK(!e->OnStageThread());
    ++*reads;
  } while (!stop->load());
}

PipelineResult RunPipeline(CachePolicy policy, int depth, bool background, std::vector<Batch> batches) {
  KernelOptions o;
  o.policy = policy;
  o.background = background;
  Kernel k(o);
  StepEngine& e = k.engine();
  Counts ref = ZeroCounts();
  PipelineResult r;
  std::atomic<bool> stop{false};
  std::thread reader(ReadCounters, &e, size_t(std::max(depth, 1)), &stop, &r.counter_reads);
  r.overflow_rows = Drive(&k, &batches, depth, &ref);
  stop = true;
  reader.join();
  for (const Batch& b : batches) r.remapped.push_back(b.remapped);
  k.Flush();
  k.CheckTiers(ref);
  // Counters: every step counted, every load a miss of the index, every write-back the mover's.
  const uint64_t n = batches.size();
  const EngineCounters c = e.counters();
  CHECK(c.steps == n && c.steps_prefetched == (depth > 0 ? n : 0)) << c.steps << " " << c.steps_prefetched;
  CHECK(c.plan_seconds > 0 && c.wait_seconds >= 0) << c.plan_seconds;
  uint64_t written = 0;
  for (size_t t = 0; t < kTables; ++t) {
    const EngineTableCounters tc = e.table_counters(t);
    const CacheCounters cc = k.index().cache(t).counters();
    const MoveCounters mc = k.mover().counters(t);
    CHECK(tc.rows_loaded == cc.misses && tc.rows_loaded == mc.rows_loaded)
        << "table " << t << ": " << tc.rows_loaded << " " << cc.misses << " " << mc.rows_loaded;
    CHECK(tc.rows_written_back == mc.rows_written_back) << tc.rows_written_back << " " << mc.rows_written_back;
    CHECK(tc.rows_loaded == 0 || tc.move_seconds > 0) << "table " << t << " moved in no time";
    written += tc.rows_written_back;
    r.evictions += cc.evictions;
  }
  CHECK(written == c.rows_written_back) << written << " " << c.rows_written_back;
  r.written_back = written;
  CHECK(e.pending() == 0 && e.InFlight() == 0 && e.last_taken_step() == int64_t(n) - 1);
  return r;
}

void TestPipeline(CachePolicy policy) {
  std::mt19937_64 rng(policy == CachePolicy::kLru ? 1 : 2);
  std::vector<Batch> batches;
  for (int64_t s = 0; s < 80; ++s) batches.push_back(RandomBatch(rng, s));
  uint64_t overflow = 0, evictions = 0, written = 0;
  for (int depth = 0; depth <= 3; ++depth) {
    const PipelineResult bg = RunPipeline(policy, depth, true, batches);
    const PipelineResult inl = RunPipeline(policy, depth, false, batches);
    CHECK(bg.remapped == inl.remapped) << "depth " << depth << ": background and inline engines gave other slots";
    CHECK(bg.overflow_rows == inl.overflow_rows && bg.written_back == inl.written_back);
    CHECK(bg.counter_reads > 0 && inl.counter_reads > 0);
    overflow += bg.overflow_rows;
    evictions += bg.evictions;
    written += bg.written_back;
  }
  // The runs exercised what they claim to: evictions, write-backs, overflow slots past the TBE.
  CHECK(overflow > 0 && evictions > 0 && written > 0) << overflow << " " << evictions << " " << written;
  std::fprintf(stderr, "  %s, background runs: %llu evictions, %llu rows written back, %llu overflow rows\n",
               CachePolicyName(policy), static_cast<unsigned long long>(evictions),
               static_cast<unsigned long long>(written), static_cast<unsigned long long>(overflow));
}

// ---------------------------------------------------------------------------------------------
// Batch problems, bad layouts, the split of variable batches and multi-feature tables.

void ExpectProblem(Kernel* k, Batch b, BatchProblemKind kind, int64_t table, int64_t pos, int64_t value) {
  StepEngine& e = k->engine();
  const size_t pending = e.pending(), in_flight = e.InFlight();
  const BatchProblem p = e.Submit(b.Input());
  CHECK(p.kind == kind) << "kind " << int64_t(p.kind) << ", want " << int64_t(kind);
  CHECK(p.table == table && p.pos == pos && p.value == value) << p.table << " " << p.pos << " " << p.value;
  CHECK(e.pending() == pending && e.InFlight() <= in_flight) << "a bad batch was queued";
  for (int64_t s : b.remapped) CHECK(s == -7) << "a bad batch was planned";
}

void ExpectInvalid(Kernel* k, Batch b, const char* what) {
  StepEngine& e = k->engine();
  const size_t pending = e.pending(), in_flight = e.InFlight();
  bool threw = false;
  try {
    (void)e.Submit(b.Input());
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw) << what << " was accepted";
  CHECK(e.pending() == pending && e.InFlight() <= in_flight) << what << " was queued";
}

// Each index's slot holds its id in its own table's cache; each table's cache saw its indices.
void CheckSplit(Kernel* k, const Batch& b, const std::array<uint64_t, kTables>& lookups_before) {
  std::array<uint64_t, kTables> count{};
  std::array<std::map<int64_t, int64_t>, kTables> row_of;
  for (size_t t = 0; t < kTables; ++t) {
    std::vector<int64_t> rows, slots;
    k->index().cache(t).Occupied(&rows, &slots);
    for (size_t j = 0; j < rows.size(); ++j) row_of[t][slots[j]] = rows[j];
  }
  for (size_t i = 0; i < b.indices.size(); ++i) {
    const size_t t = b.table[i];
    ++count[t];
    CHECK(row_of[t].count(b.remapped[i]) && row_of[t][b.remapped[i]] == b.indices[i])
        << "index " << i << " (table " << t << ", id " << b.indices[i] << ") went to slot " << b.remapped[i];
  }
  for (size_t t = 0; t < kTables; ++t)
    CHECK(k->index().cache(t).counters().lookups - lookups_before[t] == count[t]) << "table " << t;
}

std::array<uint64_t, kTables> Lookups(Kernel* k) {
  std::array<uint64_t, kTables> l;
  for (size_t t = 0; t < kTables; ++t) l[t] = k->index().cache(t).counters().lookups;
  return l;
}

void TestBatchProblems(bool background) {
  KernelOptions o;
  o.background = background;
  Kernel k(o);
  StepEngine& e = k.engine();
  Counts ref = ZeroCounts();
  // Two bags per feature; table 0 ids in [30, 50) and table 2's in [50, 80): valid only in
  // their own table, so a split that shifts a table's slice reports them out of range.
  const Bags bags = {{{31, 32}, {40}}, {{7}, {}}, {{29, 0}, {1}}, {{79}, {70, 60}}};
  Batch good = FromBags(bags, false);
  Submit(&k, &good);  // pending: 1 while the bad batches are refused
  Bags bad = bags;
  bad[1][0][0] = 30;  // table 1 has 30 rows (table 0 would take it)
  ExpectProblem(&k, FromBags(bad, false), BatchProblemKind::kIdOutOfRange, 1, 3, 30);
  bad = bags;
  bad[3][1][1] = -1;
  ExpectProblem(&k, FromBags(bad, false), BatchProblemKind::kIdOutOfRange, 2, 9, -1);
  bad = bags;
  bad[0][0][0] = 79;
  ExpectProblem(&k, FromBags(bad, false), BatchProblemKind::kIdOutOfRange, 0, 0, 79);
  Batch b = FromBags(bags, false);
  b.offsets[3] = 2;  // 0 2 3 [2] 4 ...
  ExpectProblem(&k, b, BatchProblemKind::kDecreasing, -1, 3, 2);
  b = FromBags(bags, false);
  b.offsets[0] = 1;
  ExpectProblem(&k, b, BatchProblemKind::kBadEnds, -1, 1, int64_t(b.indices.size()));
  b = FromBags(bags, false);
  b.offsets.back() = 8;
  ExpectProblem(&k, b, BatchProblemKind::kBadEnds, -1, 0, 8);
  // Offsets that fit no layout throw.
  b = FromBags(bags, false);
  b.offsets.pop_back();
  b.offsets.back() = int64_t(b.indices.size());
  ExpectInvalid(&k, b, "offsets of 8 entries for 4 features");
  b = FromBags(bags, true);
  b.feature_batch.pop_back();
  ExpectInvalid(&k, b, "a feature_batch of 3 features");
  b = FromBags(bags, true);
  b.feature_batch = {3, 2, 2, 2};
  ExpectInvalid(&k, b, "a feature_batch whose sum + 1 is not the offsets' length");
  b = FromBags(bags, true);
  b.feature_batch = {-1, 4, 2, 2};
  ExpectInvalid(&k, b, "a negative feature batch");
  // The good batch is step 0: refused batches took no step number.
  Taken g = TakeOk(&k, &good, 0);
  k.Settle(&g.step);
  k.CheckRows(good, ref);
  // Take of a bad batch with nothing pending: the problem, nothing queued or taken.
  bad = bags;
  bad[2][1][0] = 45;
  Batch bad_batch = FromBags(bad, false);
  Taken t = Take(&k, &bad_batch);
  CHECK(!t.mismatch && t.problem.kind == BatchProblemKind::kIdOutOfRange && t.problem.table == 1);
  CHECK(t.step.step == -1 && e.pending() == 0 && e.InFlight() == 0 && e.last_taken_step() == 0);
  bool threw = false;
  b.feature_batch = {1};
  try {
    Take(&k, &b);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw && e.pending() == 0) << "Take accepted a bad layout";
  CHECK(e.counters().steps == 1);
}

// Uniform and variable batches with two features in table 1, a table without bags, features
// of empty bags: each index reaches its own table's cache.
void TestBatchSplit(bool background) {
  KernelOptions o;
  o.background = background;
  Kernel k(o);
  StepEngine& e = k.engine();
  Counts ref = ZeroCounts();
  // Table 0's ids in [30, 50) and table 2's in [50, 80) are valid only in their own table.
  std::vector<Batch> batches = {
      FromBags({{{31, 32}, {40}}, {{7}, {}}, {{29, 0}, {1}}, {{79}, {70, 60}}}, false),
      FromBags({{}, {{3, 4}, {}, {5}}, {{6}}, {{55, 56}, {}}}, true),
      FromBags({{{33}, {}}, {{}, {}}, {{2}, {2, 3}}, {{}, {77}}}, false),
      FromBags({{{48}}, {{}, {}}, {}, {{50}, {51}, {}}}, true),
  };
  CHECK(batches[1].offsets.size() == 7 && batches[1].feature_batch == (std::vector<int64_t>{0, 3, 1, 2}));
  for (size_t i = 0; i < batches.size(); ++i) {
    Batch& x = batches[i];
    const auto before = Lookups(&k);
    Submit(&k, &x);
    Taken t = TakeOk(&k, &x, int64_t(i));
    k.Settle(&t.step);
    CheckSplit(&k, x, before);
    k.CheckRows(x, ref);
    k.Train(x, &ref);
  }
  CHECK(e.counters().steps == batches.size());
  k.Flush();
  k.CheckTiers(ref);
}

// ---------------------------------------------------------------------------------------------
// Take with a batch other than the pending one.

void ExpectMismatch(Kernel* k, Batch* other) {
  StepEngine& e = k->engine();
  const size_t pending = e.pending();
  const EngineCounters before = e.counters();
  Taken t = Take(k, other);
  CHECK(t.mismatch) << "another batch was taken for the pending one";
  CHECK(t.step.step == -1 && !t.step.prefetched && t.step.failure == StepFailure::kNone);
  CHECK(e.pending() == pending && e.counters().steps == before.steps && e.last_taken_step() == -1);
  for (int64_t s : other->remapped) CHECK(s == -7);
}

void TestMismatch(bool background) {
  KernelOptions o;
  o.background = background;
  Kernel k(o);
  StepEngine& e = k.engine();
  Counts ref = ZeroCounts();
  const Bags bags = {{{1, 2}, {3}}, {{4}, {5, 6}}, {{7}, {}}, {{8, 9}, {10}}};
  Batch a = FromBags(bags, false);
  Submit(&k, &a);
  Bags other = bags;
  other[3][1][0] = 11;
  Batch b = FromBags(other, false);
  ExpectMismatch(&k, &b);  // one id differs
  b = FromBags(bags, false);
  b.offsets[1] = 1;  // the same ids, bagged otherwise
  ExpectMismatch(&k, &b);
  b = FromBags(bags, true);  // the same ids and offsets, as a variable batch
  ExpectMismatch(&k, &b);
  other = bags;
  other[0][0].push_back(12);
  b = FromBags(other, false);
  ExpectMismatch(&k, &b);  // one index more
  // The same batch in other buffers: equal bytes, accepted; the slots go to the submitted
  // batch's buffer.
  Batch copy = FromBags(bags, false);
  copy.version = 99;
  Taken t = TakeOk(&k, &copy, 0);
  CHECK(t.step.prefetched);
  k.Settle(&t.step);
  for (int64_t s : copy.remapped) CHECK(s == -7) << "the slots went to the taken batch's buffer";
  k.CheckRows(a, ref);
  // The submitted buffers again with another version (their bytes compared): accepted.
  Submit(&k, &a);
  a.version = 2;
  t = TakeOk(&k, &a, 1);
  CHECK(t.step.prefetched);
  // A TakenStep used again: a step planned by Take is not reported prefetched.
  Batch c = FromBags(bags, false);
  k.engine().Take(c.Input(), true, &t.step, &t.mismatch, &t.problem);
  CHECK(!t.mismatch && t.step.failure == StepFailure::kNone && t.step.step == 2);
  CHECK(!t.step.prefetched) << "a step Take planned itself was reported prefetched";
  k.Settle(&t.step);
  k.CheckRows(c, ref);
  CHECK(e.counters().steps_prefetched == 2 && e.counters().steps == 3);
}

// ---------------------------------------------------------------------------------------------
// A tier's failed move fails its step and every later one.

void CheckStatusEqual(const Status& a, const Status& b) {
  CHECK(a.code() == b.code() && a.sys_errno() == b.sys_errno() && a.message() == b.message())
      << CodeName(a.code()) << " " << a.message() << " vs " << CodeName(b.code()) << " " << b.message();
}

// Step s loads row s of table 1 (its s+1-th move): the third move fails.
void TestMoveFailure(bool background, int depth) {
  KernelOptions o;
  o.background = background;
  o.cache_slots = {16, 16, 16};
  Kernel k(o);
  StepEngine& e = k.engine();
  k.script(1).fail_call = 3;
  std::vector<Batch> batches;
  for (int64_t s = 0; s < 8; ++s) batches.push_back(OfTables({0, 1}, {s}, {s % 2}));
  Status first;
  for (int64_t s = 0; s < std::min<int64_t>(depth, 8); ++s) Submit(&k, &batches[size_t(s)]);
  for (int64_t i = 0; i < 6; ++i) {
    Taken t = Take(&k, &batches[size_t(i)]);
    CHECK(!t.mismatch && t.step.step == i);
    if (i < 2) {
      CHECK(t.step.failure == StepFailure::kNone) << "step " << i << ": " << t.step.status.message();
    }
    if (i == 2) {
      CHECK(t.step.failure == StepFailure::kMove && t.step.failed_table == 1) << int(t.step.failure);
      CHECK(t.step.status.code() == StatusCode::kIoError && t.step.status.sys_errno() == ENOSPC)
          << CodeName(t.step.status.code()) << " " << t.step.status.message();
      first = t.step.status;
    }
    if (i > 2) {
      CHECK(t.step.failure == StepFailure::kEarlier) << "step " << i << " after a failed move: " << int(t.step.failure);
      CheckStatusEqual(t.step.status, first);
    }
    if (depth > 0 && i + depth < 8) Submit(&k, &batches[size_t(i + depth)]);
  }
  CHECK(e.last_taken_step() == 1) << e.last_taken_step();
  CHECK(k.script(1).calls.load() == 3) << "moves ran after the failed one: " << k.script(1).calls.load();
  // Drain reports the pending steps' failure (the first of them), DropPending forgets them.
  while (e.pending() < 2) Submit(&k, &batches[6 + e.pending()]);
  TakenStep drained;
  e.Drain(&drained);
  CHECK(drained.failure == StepFailure::kEarlier && drained.step == 6) << int(drained.failure) << " " << drained.step;
  CheckStatusEqual(drained.status, first);
  CHECK(e.DropPending() == 2 && e.pending() == 0 && e.InFlight() == 0);
}

// A step with nothing to move, planned while an earlier step's failing move is held, has
// finished before that failure: Take must still fail it.
void TestFailureAfterLaterStepDone() {
  Kernel k(KernelOptions{});
  StepEngine& e = k.engine();
  MoveScript& s = k.script(1);
  s.fail_call = 3;
  s.hold_call = 3;
  std::vector<Batch> b = {OfTables({0}, {0}, {}), OfTables({}, {1}, {}), OfTables({}, {2}, {}),
                          OfTables({0}, {2, 1}, {}), OfTables({}, {4}, {})};
  for (size_t i = 0; i < 4; ++i) Submit(&k, &b[i]);
  s.held.Wait();                                 // step 2's move is failing
  WaitUntil([&] { return e.InFlight() == 1; });  // step 3 (all hits) is done
  s.release.Open();
  TakeOk(&k, &b[0], 0);
  TakeOk(&k, &b[1], 1);
  Taken t = Take(&k, &b[2]);
  CHECK(t.step.failure == StepFailure::kMove && t.step.failed_table == 1);
  t = Take(&k, &b[3]);
  CHECK(t.step.failure == StepFailure::kEarlier)
      << "step 3 ran no stage after step 2 failed, but is later: failure " << int(t.step.failure);
  CHECK(e.last_taken_step() == 1);
  t = Take(&k, &b[4]);
  CHECK(t.step.failure == StepFailure::kEarlier && t.step.step == 4);
}

// ---------------------------------------------------------------------------------------------
// Shutdown.

Taken TakeCancelled(Kernel* k, Batch* b, int64_t step) {
  Taken t = Take(k, b);
  CHECK(!t.mismatch && t.step.step == step);
  CHECK(t.step.failure == StepFailure::kCancelled && t.step.status.code() == StatusCode::kClosed)
      << "step " << step << ": failure " << int(t.step.failure);
  return t;
}

// Shutdown(true) from the test's thread while step 0's plan is held in the plan hook: step 0
// completes, steps 1 and 2 are cancelled; Submit after it runs inline and is cancelled.
void TestShutdownCancelWhileHeld() {
  KernelOptions o;
  o.plan_hook = true;
  Kernel k(o);
  StepEngine& e = k.engine();
  HookScript& h = k.hooks();
  h.hold_step = 0;
  Counts ref = ZeroCounts();
  std::vector<Batch> b = {OfTables({1, 2}, {3}, {4}), OfTables({5}, {6}, {7}), OfTables({8}, {9}, {10})};
  for (Batch& x : b) Submit(&k, &x);
  h.held.Wait();
  std::thread closer([&] { e.Shutdown(true); });
  // The shutdown took effect once a batch submitted now runs inline (cancelled at once: it is
  // no longer in flight when Submit returns); the probes submitted before are queued.
  Batch probe = OfTables({11}, {12}, {13});
  int probes = 0;
  for (;;) {
    const size_t before = e.InFlight();
    Submit(&k, &probe);
    ++probes;
    if (e.InFlight() == before) break;
    std::this_thread::yield();
  }
  h.release.Open();
  closer.join();
  Taken t = TakeOk(&k, &b[0], 0);
  CHECK(t.step.overflow.empty());
  k.CheckRows(b[0], ref);
  TakeCancelled(&k, &b[1], 1);
  TakeCancelled(&k, &b[2], 2);
  for (int i = 0; i < probes; ++i) TakeCancelled(&k, &probe, 3 + i);
  CHECK(e.pending() == 0 && e.InFlight() == 0);
  CHECK(h.Planned() == std::vector<int64_t>{0}) << "a cancelled step was planned";
  e.Shutdown(true);  // idempotent
  e.Shutdown(false);
  Submit(&k, &b[1]);
  CHECK(e.InFlight() == 0 && e.pending() == 1) << "a Submit after Shutdown did not run inline";
  TakeCancelled(&k, &b[1], 3 + probes);
  TakeCancelled(&k, &b[2], 4 + probes);  // Take plans it itself: cancelled too
  CHECK(!e.OnStageThread() && h.Planned().size() == 1 && e.last_taken_step() == 0);
  k.Destroy();  // the destructor after Shutdown
}

// Shutdown(true) from the plan hook (a stage thread: it returns without joining).
void TestShutdownFromHook() {
  KernelOptions o;
  o.plan_hook = true;
  Kernel k(o);
  StepEngine& e = k.engine();
  HookScript& h = k.hooks();
  h.hold_step = 0;
  h.shutdown_step = 0;
  std::vector<Batch> b = {OfTables({1}, {2}, {3}), OfTables({4}, {5}, {6}), OfTables({7}, {8}, {9}),
                          OfTables({10}, {11}, {12})};
  for (size_t i = 0; i < 3; ++i) Submit(&k, &b[i]);
  h.shutdown_go.Open();  // steps 1 and 2 are queued
  h.held.Wait();         // after the hook's Shutdown returned
  Submit(&k, &b[3]);
  CHECK(e.InFlight() == 3) << "a Submit after Shutdown was queued: " << e.InFlight();  // steps 0 (held), 1, 2
  h.release.Open();
  TakeOk(&k, &b[0], 0);
  for (int64_t i = 1; i < 4; ++i) TakeCancelled(&k, &b[size_t(i)], i);
  CHECK(h.on_stage.load() == 1 && h.off_stage.load() == 0);
  // The destructor joins the threads (the hook's Shutdown could not).
}

// Shutdown(false) with steps queued: they all run; Submits after it run inline.
void TestShutdownDrains() {
  KernelOptions o;
  o.plan_hook = true;
  o.cache_slots = {4, 4, 4};
  Kernel k(o);
  StepEngine& e = k.engine();
  HookScript& h = k.hooks();
  Counts ref = ZeroCounts();
  std::mt19937_64 rng(5);
  std::vector<Batch> b;
  for (int64_t s = 0; s < 8; ++s) b.push_back(OfTables({int64_t(rng() % 50)}, {s % 30, 29 - s}, {s + 40}));
  for (size_t i = 0; i < 4; ++i) Submit(&k, &b[i]);
  e.Shutdown(false);
  CHECK(e.InFlight() == 0 && e.pending() == 4);
  for (int64_t i = 0; i < 4; ++i) {
    Taken t = TakeOk(&k, &b[size_t(i)], i);
    k.Settle(&t.step);
    k.CheckRows(b[size_t(i)], ref);
    k.Train(b[size_t(i)], &ref);
  }
  const int64_t stage_calls = h.on_stage.load();
  CHECK(stage_calls == 4 && h.off_stage.load() == 0);
  // After it: inline, on this thread, in order.
  for (int64_t i = 4; i < 8; ++i) {
    Batch& x = b[size_t(i)];
    if (i % 2 == 0) {
      Submit(&k, &x);
      CHECK(e.InFlight() == 0) << "a Submit after Shutdown did not run inline";
    }
    Taken t = TakeOk(&k, &x, i);
    CHECK(t.step.prefetched == (i % 2 == 0));
    k.Settle(&t.step);
    k.CheckRows(x, ref);
    k.Train(x, &ref);
  }
  CHECK(h.on_stage.load() == stage_calls && h.off_stage.load() == 4);
  k.Flush();
  k.CheckTiers(ref);
}

// Shutdown(false) called from a plan hook while later steps are queued: a Submit right after
// it must still plan and move after them (steps in submission order).
void TestSubmitWhileShutdownDrains() {
  KernelOptions o;
  o.plan_hook = true;
  o.cache_slots = {4, 4, 4};
  Kernel k(o);
  HookScript& h = k.hooks();
  h.hold_step = 0;
  h.shutdown_step = 0;
  h.shutdown_cancel = false;
  Counts ref = ZeroCounts();
  std::vector<Batch> b;
  for (int64_t s = 0; s < 4; ++s) b.push_back(OfTables({s, s + 4, s + 8, s + 12, s + 16}, {s}, {s}));
  for (size_t i = 0; i < 3; ++i) Submit(&k, &b[i]);
  h.shutdown_go.Open();  // steps 1 and 2 are queued
  h.held.Wait();
  Gate submitting;
  std::thread opener([&] {
    submitting.Wait();
    h.release.Open();
  });
  submitting.Open();
  Submit(&k, &b[3]);
  opener.join();
  CHECK(h.Planned() == (std::vector<int64_t>{0, 1, 2, 3})) << "a Submit during a draining Shutdown ran out of order";
  for (int64_t i = 0; i < 4; ++i) {
    Taken t = TakeOk(&k, &b[size_t(i)], i);
    k.Settle(&t.step);
    k.CheckRows(b[size_t(i)], ref);
    k.Train(b[size_t(i)], &ref);
  }
  k.Flush();
  k.CheckTiers(ref);
}

// ---------------------------------------------------------------------------------------------
// WaitForMoves from a plan hook; OnStageThread.

void TestWaitForMovesFromPlan() {
  KernelOptions o;
  o.plan_hook = true;
  Kernel k(o);
  StepEngine& e = k.engine();
  HookScript& h = k.hooks();
  MoveScript& s = k.script(0);
  s.hold_call = 1;
  h.wait_moves_step = 1;
  h.moves = &s;
  Counts ref = ZeroCounts();
  Batch b0 = OfTables({1, 2}, {}, {}), b1 = OfTables({3}, {4}, {});
  Submit(&k, &b0);
  s.held.Wait();  // step 0's move runs, held
  CHECK(!e.OnStageThread());
  Submit(&k, &b1);
  h.waiting.Wait();  // step 1's plan is in (or entering) WaitForMoves
  s.release.Open();
  Taken t0 = TakeOk(&k, &b0, 0);
  k.Settle(&t0.step);
  Taken t1 = TakeOk(&k, &b1, 1);
  k.Settle(&t1.step);
  CHECK(h.done_at_return.load() >= 1) << "WaitForMoves returned while step 0's move was held";
  const std::vector<uint64_t> done = s.DoneSeq();
  CHECK(!done.empty() && h.return_seq.load() > done[0]) << "WaitForMoves returned before the move ended";
  CHECK(h.on_stage.load() == 2 && h.off_stage.load() == 0);
  CHECK(s.on_stage.load() == s.calls.load() && s.off_stage.load() == 0);
  k.CheckRows(b0, ref);
  k.CheckRows(b1, ref);
  e.WaitForMoves();  // nothing moving: returns
}

// Inline: hooks and moves run on the caller's thread, which is no stage thread.
void TestInlineThreads() {
  KernelOptions o;
  o.plan_hook = true;
  o.background = false;
  Kernel k(o);
  HookScript& h = k.hooks();
  h.wait_moves_step = 0;
  h.moves = &k.script(0);
  Batch b = OfTables({1}, {2}, {3});
  Submit(&k, &b);
  CHECK(k.engine().InFlight() == 0);
  TakeOk(&k, &b, 0);
  CHECK(h.on_stage.load() == 0 && h.off_stage.load() == 1 && h.done_at_return.load() == 0);
  for (size_t t = 0; t < kTables; ++t) CHECK(k.script(t).on_stage.load() == 0 && k.script(t).off_stage.load() == 1);
}

// ---------------------------------------------------------------------------------------------
// Write guards and before_write; fault points.

// The hook's calls [from_hook, end) are table t's, one before each of its tier's evictions
// [from_tier, end), with the same ids.
void CheckGuarded(Kernel* k, size_t t, size_t from_hook, size_t from_tier) {
  const std::vector<HookScript::Write> writes = k->hooks().Writes();
  const std::vector<std::vector<int64_t>> evicts = k->script(t).Evicts();
  const std::vector<uint64_t> seq = k->script(t).EvictSeq();
  CHECK(writes.size() - from_hook == evicts.size() - from_tier)
      << writes.size() - from_hook << " hook calls for " << evicts.size() - from_tier << " write-backs of table " << t;
  CHECK(evicts.size() > from_tier) << "table " << t << " wrote nothing back";
  for (size_t j = 0; j < evicts.size() - from_tier; ++j) {
    const HookScript::Write& w = writes[from_hook + j];
    CHECK(w.table == int64_t(t) && w.ids == evicts[from_tier + j]) << "hook call " << from_hook + j;
    CHECK(w.seq < seq[from_tier + j]) << "the rows were written before the hook ran";
  }
}

void TestWriteGuard(bool background) {
  KernelOptions o;
  o.background = background;
  o.before_write = true;
  o.cache_slots = {4, 4, 8};
  Kernel k(o);
  StepEngine& e = k.engine();
  HookScript& h = k.hooks();
  Counts ref = ZeroCounts();
  std::mt19937_64 rng(7);
  e.SetWriteGuard(1, true);
  std::vector<Batch> b = RandomBatches(rng, 0, 20);
  Drive(&k, &b, 2, &ref);
  CHECK(k.script(0).Evicts().size() > 0) << "table 0 wrote nothing back";
  CheckGuarded(&k, 1, 0, 0);  // only table 1's, though table 0 wrote back too
  // The guards swapped between steps.
  e.SetWriteGuard(1, false);
  e.SetWriteGuard(0, true);
  const size_t hook_from = h.Writes().size(), tier_from = k.script(0).Evicts().size();
  const size_t other_from = k.script(1).Evicts().size();
  b = RandomBatches(rng, 20, 20);
  Drive(&k, &b, 2, &ref);
  CheckGuarded(&k, 0, hook_from, tier_from);
  CHECK(k.script(1).Evicts().size() > other_from);
  CHECK((background ? h.on_stage : h.off_stage).load() == int64_t(h.Writes().size()));
  bool threw = false;
  try {
    e.SetWriteGuard(kTables, true);
  } catch (const std::out_of_range&) {
    threw = true;
  }
  CHECK(threw) << "a guard for a table past the kernel";
  // A hook returning non-zero fails its step (nothing of it moved) and every later one.
  h.fail_write_call = h.write_calls.load() + 1;
  std::array<int64_t, kTables> calls;
  int64_t failed = -1;
  for (int64_t s = 40; s < 80 && failed < 0; ++s) {
    for (size_t t = 0; t < kTables; ++t) calls[t] = k.script(t).calls.load();
    Batch x = RandomBatch(rng, s);
    x.plan_train = x.take_train = true;
    Taken t = Take(&k, &x);
    CHECK(!t.mismatch && t.step.step == s);
    if (t.step.failure == StepFailure::kNone) {
      k.Settle(&t.step);
      k.CheckRows(x, ref);
      k.Train(x, &ref);
      continue;
    }
    CHECK(t.step.failure == StepFailure::kHook && t.step.failed_table == 0 && t.step.hook_step == s)
        << int(t.step.failure) << " " << t.step.failed_table << " " << t.step.hook_step;
    for (size_t u = 0; u < kTables; ++u) CHECK(k.script(u).calls.load() == calls[u]) << "table " << u << " moved";
    failed = s;
  }
  CHECK(failed >= 0) << "the hook never failed";
  Batch x = OfTables({1}, {2}, {3});
  Taken t = Take(&k, &x);
  CHECK(t.step.failure == StepFailure::kEarlier && t.step.step == failed + 1 && t.step.hook_step == -1);
}

// Fault points: phases 0 and 1 around each plan, in step order; a non-zero return fails its
// step (kHook) and every later one.
void TestFaultHook(bool background) {
  KernelOptions o;
  o.background = background;
  o.fault = true;
  Kernel k(o);
  HookScript& h = k.hooks();
  h.fail_fault_step = 3;
  h.fail_fault_phase = 1;
  Counts ref = ZeroCounts();
  std::vector<Batch> b;
  for (int64_t s = 0; s < 5; ++s) b.push_back(OfTables({s}, {s}, {s}));
  std::vector<Batch> ok(b.begin(), b.begin() + 3);
  Drive(&k, &ok, 2, &ref);
  Submit(&k, &b[3]);
  Submit(&k, &b[4]);
  Taken t = Take(&k, &b[3]);
  CHECK(t.step.failure == StepFailure::kHook && t.step.hook_step == 3) << int(t.step.failure);
  t = Take(&k, &b[4]);
  CHECK(t.step.failure == StepFailure::kEarlier) << int(t.step.failure);
  std::vector<std::pair<int64_t, int64_t>> want;
  for (int64_t s = 0; s < 4; ++s) want.emplace_back(s, 0), want.emplace_back(s, 1);
  CHECK(h.Faults() == want) << h.Faults().size() << " fault points";
}


// ---------------------------------------------------------------------------------------------
// Dirty bitmaps, DropPending, the constructor's checks.

// A step taken in train mode marks its rows; one taken in eval mode none (a dense table
// makes no rows: TestVirtualTables covers new ids' rows); rows past a bitmap are left alone.
void TestDirtyBitmaps(bool background) {
  KernelOptions o;
  o.background = background;
  o.plan_hook = true;
  Kernel k(o);
  StepEngine& e = k.engine();
  std::array<std::vector<uint8_t>, kTables> bits = {std::vector<uint8_t>(7), std::vector<uint8_t>(4),
                                                    std::vector<uint8_t>(2)};  // table 2: rows 0-15 only
  e.SetDirtyBitmaps({{bits[0].data(), 56}, {bits[1].data(), 32}, {bits[2].data(), 16}});
  auto marked = [&](size_t t) {
    std::set<int64_t> rows;
    for (size_t r = 0; r < bits[t].size() * 8; ++r)
      if (bits[t][r >> 3] & (1u << (r & 7))) rows.insert(int64_t(r));
    return rows;
  };
  auto expect = [&](std::set<int64_t> t0, std::set<int64_t> t1, std::set<int64_t> t2) {
    CHECK(marked(0) == t0 && marked(1) == t1 && marked(2) == t2)
        << marked(0).size() << " " << marked(1).size() << " " << marked(2).size() << " rows marked";
  };
  Batch a = OfTables({1, 41}, {2}, {3, 70});
  Submit(&k, &a);
  TakeOk(&k, &a, 0);
  expect({1, 41}, {2}, {3});
  Batch b = OfTables({5, 45}, {6}, {7, 12});
  b.plan_train = b.take_train = false;
  Submit(&k, &b);
  TakeOk(&k, &b, 1);
  expect({1, 41}, {2}, {3});
  Batch c = OfTables({8, 48}, {9}, {10});
  Submit(&k, &c);
  TakenStep drained;
  e.Drain(&drained);
  e.MarkPendingCreated();
  expect({1, 41}, {2}, {3});
  TakeOk(&k, &c, 2);
  expect({1, 8, 41, 48}, {2, 9}, {3, 10});
}

// Steps dropped after a drain: never trained, their numbers skipped; the steps after them
// train as before. The destructor then meets steps still queued.
void TestDropPending() {
  Kernel k(KernelOptions{});
  StepEngine& e = k.engine();
  Counts ref = ZeroCounts();
  std::mt19937_64 rng(9);
  std::vector<Batch> a = RandomBatches(rng, 0, 10), dropped = RandomBatches(rng, 10, 2);
  std::vector<Batch> b = RandomBatches(rng, 12, 10), queued = RandomBatches(rng, 22, 3);
  Drive(&k, &a, 2, &ref);
  for (Batch& x : dropped) Submit(&k, &x);
  TakenStep drained;
  e.Drain(&drained);
  CHECK(drained.failure == StepFailure::kNone);
  k.Settle(&drained);  // their loads past the TBE are cached rows: copied in (kernels/steps.py's cancel)
  CHECK(e.DropPending() == 2 && e.pending() == 0 && e.InFlight() == 0);
  Drive(&k, &b, 2, &ref, 12);
  k.Flush();
  k.CheckTiers(ref);
  for (Batch& x : queued) Submit(&k, &x);
  k.Destroy();
}

// The look-ahead window: with steps submitted k + 2 ahead of the one taken (Drive submits
// after its take, and a step is planned once the one before it is taken), a row that one of
// the k steps before uses is never missed (no plan between them evicts it; the cache's own
// test shows the window is what keeps them).
// Results stay the reference's, and background and inline engines plan the same slots.
// A step waited for before its window is in is planned anyway; Drain and DropPending run the
// steps an inline window holds back; the window changes only with nothing pending.

// Distinct rows of each step whose table's previous k steps do not use them: the most misses
// a window of k allows, summed over the steps and tables.
uint64_t MissBound(const std::vector<Batch>& batches, int k) {
  uint64_t bound = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    std::set<std::pair<size_t, int64_t>> recent, seen;
    for (size_t a = b >= size_t(k) ? b - size_t(k) : 0; a < b; ++a)
      for (size_t i = 0; i < batches[a].indices.size(); ++i) recent.insert({batches[a].table[i], batches[a].indices[i]});
    for (size_t i = 0; i < batches[b].indices.size(); ++i) {
      const std::pair<size_t, int64_t> row{batches[b].table[i], batches[b].indices[i]};
      if (seen.insert(row).second && !recent.count(row)) ++bound;
    }
  }
  return bound;
}

uint64_t Misses(Kernel* k) {
  uint64_t misses = 0;
  for (size_t t = 0; t < kTables; ++t) misses += k->index().cache(t).counters().misses;
  return misses;
}

void TestLookahead() {
  std::mt19937_64 rng(21);
  const std::vector<Batch> batches = RandomBatches(rng, 0, 60);
  for (int window : {1, 3}) {
    std::vector<std::vector<int64_t>> slots[2];
    for (bool bg : {true, false}) {
      KernelOptions o;
      o.background = bg;
      Kernel k(o);
      k.engine().SetLookahead(size_t(window));
      CHECK(k.engine().lookahead() == size_t(window));
      std::vector<Batch> run = batches;
      Counts ref = ZeroCounts();
      Drive(&k, &run, window + 2, &ref);
      CHECK(Misses(&k) <= MissBound(batches, window)) << "window " << window << ": " << Misses(&k) << " misses, at most "
                                                      << MissBound(batches, window);
      for (const Batch& b : run) slots[bg].push_back(b.remapped);
      k.Flush();
      k.CheckTiers(ref);
    }
    CHECK(slots[0] == slots[1]) << "window " << window << ": background and inline engines gave other slots";
  }
  for (bool bg : {true, false}) {
    KernelOptions o;
    o.background = bg;
    Kernel k(o);
    StepEngine& e = k.engine();
    e.SetLookahead(4);
    std::vector<Batch> run = RandomBatches(rng, 0, 3);
    Counts ref = ZeroCounts();
    Submit(&k, &run[0]);
    Submit(&k, &run[1]);
    bool threw = false;
    try {
      e.SetLookahead(1);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    CHECK(threw && e.lookahead() == 4) << "the window changed with steps pending";
    Taken t = TakeOk(&k, &run[0], 0);  // its window holds one step of four: planned anyway
    k.Settle(&t.step);
    k.CheckRows(run[0], ref);
    k.Train(run[0], &ref);
    Submit(&k, &run[2]);
    TakenStep drained;
    e.Drain(&drained);
    CHECK(drained.failure == StepFailure::kNone);
    k.Settle(&drained);
    CHECK(e.InFlight() == 0 && e.pending() == 2);
    CHECK(e.DropPending() == 2 && e.pending() == 0);
    e.SetLookahead(0);
    std::vector<Batch> more = RandomBatches(rng, 3, 5);
    Drive(&k, &more, 1, &ref, 3);
    k.Flush();
    k.CheckTiers(ref);
  }
}

// A virtual table (table 0): its cache keyed by id, its rows given by an IdIndex. The ids a
// step's cache misses are looked up, those it holds are not; new ids' rows are marked in the
// dirty bitmap even by an eval step; a step that brings more ids than the rows fails its
// plan with ENOSPC, naming the table, and so does every later step.
void TestVirtualTable(bool background) {
  const std::vector<int64_t> bounds = {int64_t(1) << 40, kIdBounds[1], kIdBounds[2]};
  KernelCacheIndex index({TableCacheSpec{12, 0, false, true}, TableCacheSpec{8}, TableCacheSpec{16}}, 4,
                         CachePolicy::kLru);
  std::vector<std::unique_ptr<TierTable>> tiers;
  StepMover mover(kTables);
  for (size_t t = 0; t < kTables; ++t) {
    tiers.push_back(std::make_unique<TierTable>(t));
    mover.SetTier(t, tiers[t]->Mapped());
  }
  auto ids = std::make_shared<IdIndex>(4, true, false);
  VirtualIds virt(&index, NormEviction{});
  VirtualTable vt;
  vt.table = 0;
  vt.name = "virt";
  vt.index = ids;
  virt.Add(vt);
  StepEngine e(&index, &mover, bounds, kTableOfFeature, background, EngineHooks{}, &virt);
  std::array<Tbe, kTables> tbes;
  std::vector<SlotRows> slots;
  for (size_t t = 0; t < kTables; ++t) {
    tbes[t].Resize(64);
    slots.push_back(tbes[t].View());
  }
  e.SetSlots(slots);
  std::vector<uint8_t> bits(1);
  e.SetDirtyBitmaps({{bits.data(), 8}, {nullptr, 0}, {nullptr, 0}});
  const int64_t a = int64_t(1) << 39, b = 77, c = (int64_t(1) << 40) - 1, d = 12345;
  auto take = [&](Batch* x) {
    CHECK(e.Submit(x->Input()).kind == BatchProblemKind::kOk);
    TakenStep out;
    bool mismatch = true;
    BatchProblem problem;
    e.Take(x->Input(), x->take_train, &out, &mismatch, &problem);
    CHECK(!mismatch && problem.kind == BatchProblemKind::kOk);
    return out;
  };
  Batch s0 = OfTables({a, b, a}, {1}, {2});
  TakenStep t0 = take(&s0);
  CHECK(t0.failure == StepFailure::kNone) << t0.status.message();
  CHECK(s0.remapped[0] == s0.remapped[2] && s0.remapped[0] != s0.remapped[1]);
  CHECK(virt.Lookups(0) == std::make_pair(uint64_t(0), uint64_t(3)));
  CHECK(bits[0] == 0b11) << int(bits[0]);  // rows 0 and 1, trained
  std::vector<int64_t> rows(2);
  const std::vector<int64_t> ab = {a, b};
  ids->Find(ab.data(), 2, rows.data());
  CHECK(rows == (std::vector<int64_t>{0, 1}));
  Batch s1 = OfTables({a, c, a}, {1}, {2});
  s1.plan_train = s1.take_train = false;
  TakenStep t1 = take(&s1);
  CHECK(t1.failure == StepFailure::kNone) << t1.status.message();
  CHECK(s1.remapped[0] == s0.remapped[0]) << "a cached id moved";
  CHECK(virt.Lookups(0) == std::make_pair(uint64_t(2), uint64_t(4))) << "a hit was looked up";
  CHECK(bits[0] == 0b111) << int(bits[0]);  // the eval step's new row (2) only
  float counts[3];
  uint32_t times[3];
  const std::vector<int64_t> r012 = {0, 1, 2};
  ids->Metadata(r012.data(), 3, counts, times);
  CHECK(counts[0] == 4.f && counts[1] == 1.f && counts[2] == 1.f) << "hits counted by row";
  Batch s2 = OfTables({d, d + 1}, {1}, {2});  // 2 new ids, 1 free row
  TakenStep t2 = take(&s2);
  CHECK(t2.failure == StepFailure::kPlan && t2.status.sys_errno() == ENOSPC) << int(t2.failure);
  CHECK(t2.status.message().find("virtual table virt") != std::string::npos) << t2.status.message();
  Batch s3 = OfTables({a}, {1}, {2});
  TakenStep t3 = take(&s3);
  CHECK(t3.failure == StepFailure::kEarlier) << int(t3.failure);
}

void TestConstructorChecks() {
  KernelCacheIndex index({8, 8, 8}, 4, CachePolicy::kLru);
  StepMover mover(kTables), small(2);
  auto refused = [](auto make) {
    try {
      make();
    } catch (const std::invalid_argument&) {
      return true;
    }
    return false;
  };
  CHECK(refused([&] { StepEngine(nullptr, &mover, kIdBounds, {}, true, EngineHooks{}); }));
  CHECK(refused([&] { StepEngine(&index, nullptr, kIdBounds, {}, true, EngineHooks{}); }));
  CHECK(refused([&] { StepEngine(&index, &small, kIdBounds, {}, true, EngineHooks{}); }));
  CHECK(refused([&] { StepEngine(&index, &mover, {50, 30}, {}, false, EngineHooks{}); }));
  // One feature per table by default; no slots set: the step's move fails, naming its table.
  StepEngine e(&index, &mover, kIdBounds, {}, true, EngineHooks{});
  CHECK(e.num_tables() == kTables && e.pending() == 0 && e.last_taken_step() == -1);
  std::vector<int64_t> indices = {49, 29, 79}, offsets = {0, 1, 2, 3}, remapped(3, -7);
  StepInput in;
  in.indices = indices.data();
  in.n = indices.size();
  in.offsets = offsets.data();
  in.num_offsets = offsets.size();
  in.remapped = remapped.data();
  CHECK(e.Submit(in).kind == BatchProblemKind::kOk);
  TakenStep out;
  bool mismatch = true;
  BatchProblem problem;
  e.Take(in, true, &out, &mismatch, &problem);
  CHECK(!mismatch && out.failure == StepFailure::kMove && out.failed_table == 0 &&
        out.status.code() == StatusCode::kInvalidArgument)
      << int(out.failure) << " " << out.failed_table << " " << out.status.message();
  for (size_t t = 0; t < kTables; ++t) CHECK(index.cache(t).counters().lookups == 1) << "table " << t;
}

}  // namespace
}  // namespace testing
}  // namespace mtrains

int main() {
  using namespace mtrains;
  using namespace mtrains::testing;
  Run("pipeline == reference, depth 0-3, background and inline (lru)", [] { TestPipeline(CachePolicy::kLru); });
  Run("pipeline == reference, depth 0-3, background and inline (tinylfu)",
      [] { TestPipeline(CachePolicy::kTinyLfu); });
  for (bool bg : {true, false}) {
    const std::string mode = bg ? " (background)" : " (inline)";
    Run(("batch problems" + mode).c_str(), [bg] { TestBatchProblems(bg); });
    Run(("the split of a batch by table" + mode).c_str(), [bg] { TestBatchSplit(bg); });
    Run(("take of another batch" + mode).c_str(), [bg] { TestMismatch(bg); });
    for (int depth = 0; depth <= 3; ++depth)
      Run(("a failed move fails its step and every later one, depth " + std::to_string(depth) + mode).c_str(),
          [bg, depth] { TestMoveFailure(bg, depth); });
    Run(("write guards and before_write" + mode).c_str(), [bg] { TestWriteGuard(bg); });
    Run(("fault points" + mode).c_str(), [bg] { TestFaultHook(bg); });
    Run(("dirty bitmaps" + mode).c_str(), [bg] { TestDirtyBitmaps(bg); });
    Run(("a virtual table: keyed cache, id lookups for misses only" + mode).c_str(),
        [bg] { TestVirtualTable(bg); });
  }
  Run("DropPending, then more steps; the destructor with steps queued", TestDropPending);
  Run("the look-ahead window: no row the window uses is evicted; forced plans; held steps", TestLookahead);
  Run("the constructor's checks", TestConstructorChecks);
  Run("a step done before an earlier step failed fails too", TestFailureAfterLaterStepDone);
  Run("Shutdown(true) while a plan is held", TestShutdownCancelWhileHeld);
  Run("Shutdown(true) from a plan hook", TestShutdownFromHook);
  Run("Shutdown(false) runs the queued steps; Submits after it run inline", TestShutdownDrains);
  Run("a Submit while Shutdown(false) drains keeps step order", TestSubmitWhileShutdownDrains);
  Run("WaitForMoves from a plan hook", TestWaitForMovesFromPlan);
  Run("inline engine: hooks and moves on the caller's thread", TestInlineThreads);
  std::fprintf(stderr, "test_step_engine: all passed\n");
  return 0;
}
