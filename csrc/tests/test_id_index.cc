// Standalone driver for IdIndex (kernel/id_index.h): maps, evictions and removals against a
// model, through table growth and backward-shift deletion; rollback of a map that runs out
// of rows; fresh rows; Assign's checks; the bytes a live id costs.
//
// Usage: test_id_index   (no files are written)
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <random>
#include <set>
#include <vector>

#include "kernel/id_index.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::Run;

void CheckModel(const IdIndex& index, const std::map<int64_t, int64_t>& model) {
  std::vector<int64_t> ids, rows;
  index.Entries(&ids, &rows);
  CHECK(ids.size() == model.size()) << ids.size() << " live, model has " << model.size();
  std::set<int64_t> seen_rows;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = model.find(ids[i]);
    CHECK(it != model.end()) << "id " << ids[i] << " is live, not in the model";
    CHECK(it->second == rows[i]) << "id " << ids[i] << " row " << rows[i] << " != " << it->second;
    CHECK(seen_rows.insert(rows[i]).second) << "row " << rows[i] << " held twice";
  }
  std::vector<int64_t> probe, found;
  for (const auto& [id, row] : model) probe.push_back(id);
  found.resize(probe.size());
  index.Find(probe.data(), probe.size(), found.data());
  for (size_t i = 0; i < probe.size(); ++i) CHECK(found[i] == model.at(probe[i]));
}

void TestAgainstModel() {
  const uint64_t capacity = 20000;
  IdIndex index(capacity, true, true);
  std::map<int64_t, int64_t> model;
  std::mt19937_64 rng(7);
  for (int round = 0; round < 60; ++round) {
    // A batch of ids, some repeated, some live, many new, drawn from [0, 2^62).
    std::vector<int64_t> ids;
    for (int k = 0; k < 400; ++k) {
      if (!model.empty() && rng() % 3 == 0) {
        auto it = model.begin();
        std::advance(it, rng() % model.size());
        ids.push_back(it->first);
      } else {
        ids.push_back(int64_t(rng() >> 2));
      }
      if (rng() % 5 == 0) ids.push_back(ids.back());
    }
    std::vector<int64_t> rows(ids.size()), created;
    CHECK_OK(index.Map(ids.data(), ids.size(), true, uint32_t(round), rows.data(), &created));
    std::set<int64_t> created_ids;
    for (int64_t at : created) CHECK(created_ids.insert(ids[at]).second) << "id created twice in one map";
    for (size_t i = 0; i < ids.size(); ++i) {
      auto it = model.find(ids[i]);
      if (it == model.end()) {
        CHECK(created_ids.count(ids[i])) << "new id " << ids[i] << " not reported as created";
        model[ids[i]] = rows[i];
      } else {
        CHECK(it->second == rows[i]) << "id " << ids[i] << " moved from row " << it->second << " to " << rows[i];
      }
    }
    if (round % 7 == 6) {  // remove a third of the live ids
      std::vector<int64_t> gone, freed;
      for (const auto& [id, row] : model)
        if (rng() % 3 == 0) gone.push_back(id);
      index.Remove(gone.data(), gone.size(), &freed);
      CHECK(freed.size() == gone.size());
      for (int64_t id : gone) model.erase(id);
    }
    CheckModel(index, model);
  }
  const IdIndexStats s = index.Stats();
  CHECK(s.live == model.size());
  CHECK(s.rows_used <= capacity);
  CHECK(double(s.index_bytes) / double(s.rows_used) <= 16.0) << double(s.index_bytes) / double(s.rows_used) << " B per row";
}

// Entries split into row number and fingerprint by the capacity: none left for a table of
// 2^31 rows (every probe compares ids), many for a small one; both find every id.
void TestEntryWidths() {
  for (uint64_t capacity : {uint64_t(5), uint64_t(1000), (uint64_t(1) << 31) + 7}) {
    IdIndex index(capacity, false, false);
    std::map<int64_t, int64_t> model;
    std::mt19937_64 rng(capacity);
    const size_t n = std::min<uint64_t>(capacity, 3000);
    std::vector<int64_t> ids(n), rows(n), created;
    for (auto& id : ids) id = int64_t(rng() >> 1);
    CHECK_OK(index.Map(ids.data(), n, true, 0, rows.data(), &created));
    for (size_t i = 0; i < n; ++i) model[ids[i]] = rows[i];
    CheckModel(index, model);
    std::vector<int64_t> gone(ids.begin(), ids.begin() + n / 2), freed;
    index.Remove(gone.data(), gone.size(), &freed);
    for (int64_t id : gone) model.erase(id);
    CheckModel(index, model);
  }
}

void TestFullMapChangesNothing() {
  IdIndex index(10, false, false);
  std::vector<int64_t> ids = {1, 2, 3, 4, 5, 6, 7, 8}, rows(8), created;
  CHECK_OK(index.Map(ids.data(), ids.size(), true, 0, rows.data(), &created));
  std::vector<int64_t> more = {9, 2, 10, 11, 12}, more_rows(5);
  created.clear();
  const Status st = index.Map(more.data(), more.size(), true, 0, more_rows.data(), &created);
  CHECK(st.code() == StatusCode::kIoError && st.sys_errno() == ENOSPC) << st.message();
  CHECK(created.empty());
  std::vector<int64_t> live, live_rows;
  index.Entries(&live, &live_rows);
  CHECK(live.size() == 8) << live.size();
  CHECK(index.Stats().live == 8);
  // Without create, unknown ids map to -1 and nothing is made.
  std::vector<int64_t> probe = {9, 3}, probe_rows(2);
  CHECK_OK(index.Map(probe.data(), 2, false, 0, probe_rows.data(), &created));
  CHECK(probe_rows[0] == -1 && probe_rows[1] == rows[2]);
  std::vector<int64_t> neg = {-4}, neg_rows(1);
  CHECK_CODE(index.Map(neg.data(), 1, true, 0, neg_rows.data(), &created), kInvalidArgument);
}

void TestFreshRows() {
  IdIndex index(4, false, false);
  std::vector<int64_t> ids = {100, 200}, rows(2), created;
  CHECK_OK(index.Map(ids.data(), 2, true, 0, rows.data(), &created));
  std::vector<uint8_t> fresh(3);
  std::vector<int64_t> owners(3), probe = {rows[0], rows[1], 3};
  index.TakeFresh(probe.data(), 3, fresh.data(), owners.data());
  CHECK(fresh[0] && fresh[1] && !fresh[2]);
  CHECK(owners[0] == 100 && owners[1] == 200 && owners[2] == -1);
  index.TakeFresh(probe.data(), 2, fresh.data(), owners.data());
  CHECK(!fresh[0] && !fresh[1]) << "a row is fresh until its first load";
  // A freed row taken by another id is fresh again, for that id.
  std::vector<int64_t> gone = {100}, freed;
  index.Remove(gone.data(), 1, &freed);
  std::vector<int64_t> next = {300}, next_rows(1);
  CHECK_OK(index.Map(next.data(), 1, true, 0, next_rows.data(), &created));
  CHECK(next_rows[0] == freed[0]) << "the freed row is reused";
  index.TakeFresh(next_rows.data(), 1, fresh.data(), owners.data());
  CHECK(fresh[0] && owners[0] == 300);
}

void TestEvictionRules() {
  IdIndex index(100, true, true);
  std::vector<int64_t> hot = {1, 2}, cold = {3, 4}, rows(2), created;
  for (int k = 0; k < 5; ++k) CHECK_OK(index.Map(hot.data(), 2, true, 100, rows.data(), &created));
  CHECK_OK(index.Map(cold.data(), 2, true, 10, rows.data(), &created));
  std::vector<int64_t> ids, freed;
  // Count only: decay 0.5 -> hot 2.5, cold 0.5; threshold 1 evicts the cold ids.
  EvictionRule by_count{0.5, 1.0, 0};
  index.Evict(by_count, 200, nullptr, 0, &ids, &freed);
  CHECK(std::set<int64_t>(ids.begin(), ids.end()) == std::set<int64_t>({3, 4}));
  // Time and count: hot ids are stale at t=500 (ttl 60) but counted 2.5 * 0.5 = 1.25 >= 1.
  ids.clear();
  EvictionRule both{0.5, 1.0, 60};
  index.Evict(both, 500, nullptr, 0, &ids, &freed);
  CHECK(ids.empty());
  // Kept rows are never evicted, whatever the rule says.
  EvictionRule by_time{1.0, 0, 60};
  std::vector<int64_t> keep(1);
  std::vector<int64_t> one = {1};
  index.Find(one.data(), 1, keep.data());
  index.Evict(by_time, 500, keep.data(), 1, &ids, &freed);
  CHECK(ids.size() == 1 && ids[0] == 2) << ids.size();
}

void TestAssign() {
  IdIndex index(50, true, false);
  std::vector<int64_t> ids = {5, 9, 1ll << 61}, rows = {40, 3, 7};
  std::vector<float> counts = {1.f, 2.f, 3.f};
  CHECK_OK(index.Assign(ids.data(), rows.data(), 3, counts.data(), nullptr));
  std::vector<int64_t> found(3);
  index.Find(ids.data(), 3, found.data());
  CHECK(found == rows);
  std::vector<float> got(3);
  std::vector<uint32_t> times(3);
  index.Metadata(rows.data(), 3, got.data(), times.data());
  CHECK(got == counts);
  // New ids take the rows Assign left free, then rows above.
  std::vector<int64_t> more(45), more_rows(45), created;
  for (int i = 0; i < 45; ++i) more[i] = 1000 + i;
  CHECK_OK(index.Map(more.data(), 45, true, 0, more_rows.data(), &created));
  std::set<int64_t> all(more_rows.begin(), more_rows.end());
  all.insert(rows.begin(), rows.end());
  CHECK(all.size() == 48);
  std::vector<int64_t> dup_rows = {1, 1};
  std::vector<int64_t> two = {1, 2};
  CHECK_CODE(index.Assign(two.data(), dup_rows.data(), 2, nullptr, nullptr), kInvalidArgument);
  std::vector<int64_t> past = {50};
  std::vector<int64_t> lone = {77};
  CHECK_CODE(index.Assign(lone.data(), past.data(), 1, nullptr, nullptr), kInvalidArgument);
  // A refused Assign leaves the index as it was.
  index.Find(ids.data(), 3, found.data());
  CHECK(found == rows);
}

// The kernel's two threads: the plan thread maps steps (new ids, evictions) while the I/O
// thread takes each mapped step's fresh rows, as VirtualTierRows does. Every new row is
// taken fresh exactly once, with its id. Run under TSan by scripts/sanitize.sh.
void TestMapsWhileTakingFresh() {
  IdIndex index(50000, true, false);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::vector<int64_t>, std::vector<int64_t>>> steps;  // (new rows, their ids)
  bool done = false;
  int taken = 0;  // steps whose fresh rows the I/O thread took
  std::thread io([&] {
    for (;;) {
      std::pair<std::vector<int64_t>, std::vector<int64_t>> step;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done || !steps.empty(); });
        if (steps.empty()) return;
        step = std::move(steps.front());
        steps.pop_front();
      }
      const auto& [rows, ids] = step;
      std::vector<uint8_t> fresh(rows.size());
      std::vector<int64_t> owners(rows.size());
      index.TakeFresh(rows.data(), rows.size(), fresh.data(), owners.data());
      for (size_t i = 0; i < rows.size(); ++i) {
        CHECK(fresh[i]) << "new row " << rows[i] << " not fresh";
        CHECK(owners[i] == ids[i]) << "row " << rows[i] << " made for " << ids[i] << ", says " << owners[i];
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        ++taken;
      }
      cv.notify_all();
    }
  });
  std::mt19937_64 rng(5);
  for (int step = 0; step < 200; ++step) {
    std::vector<int64_t> ids(512), rows(512), created;
    for (auto& id : ids) id = int64_t(rng() >> 3);  // distinct in practice: all new
    CHECK_OK(index.Map(ids.data(), ids.size(), true, uint32_t(step), rows.data(), &created));
    std::vector<int64_t> new_rows, new_ids;
    for (int64_t at : created) {
      new_rows.push_back(rows[at]);
      new_ids.push_back(ids[at]);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      steps.emplace_back(std::move(new_rows), std::move(new_ids));
    }
    cv.notify_all();
    if (step % 20 == 19) {
      // As the kernel evicts only rows of steps already moved: wait for the I/O thread
      // to take every step's fresh rows, then evict all but this step's rows.
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return taken == step + 1; });
      }
      std::vector<int64_t> evicted, freed;
      EvictionRule rule{0.5, 10.0, 0};
      std::vector<int64_t> keep(rows.begin(), rows.end());
      index.Evict(rule, uint32_t(step), keep.data(), keep.size(), &evicted, &freed);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  io.join();
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("id index: maps and removals vs model, ids from [0, 2^62)", TestAgainstModel);
  Run("id index: entries' row and fingerprint bits at every capacity", TestEntryWidths);
  Run("id index: a map that runs out of rows changes nothing", TestFullMapChangesNothing);
  Run("id index: fresh rows until their first load", TestFreshRows);
  Run("id index: count, time and both rules; kept rows", TestEvictionRules);
  Run("id index: assign", TestAssign);
  Run("id index: maps while another thread takes fresh rows", TestMapsWhileTakingFresh);
  std::fprintf(stderr, "test_id_index: all passed\n");
  return 0;
}
