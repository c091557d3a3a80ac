// Standalone driver for LocationMap (storage/location_map.h): random sets against a model
// at several value widths, through the sparse -> dense transition, checked with Get, Fill
// and ForEach, and the memory it reports for sparse and dense tables.
//
// Usage: test_location_map   (no files are written)
#include <cstdio>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "storage/location_map.h"
#include "tests/check.h"

namespace mtrains {
namespace {

using testing::Run;

void CheckAgainstModel(const LocationMap& m, const std::map<uint64_t, uint64_t>& model, uint64_t rows) {
  for (const auto& [row, v] : model) CHECK(m.Get(row) == v) << "row " << row << ": " << m.Get(row) << " != " << v;
  std::map<uint64_t, uint64_t> seen;
  uint64_t last = 0;
  bool first = true;
  m.ForEach([&](uint64_t row, uint64_t v) {
    CHECK(first || row > last) << "ForEach out of order at row " << row;
    first = false;
    last = row;
    seen[row] = v;
  });
  std::map<uint64_t, uint64_t> nonzero;
  for (const auto& [row, v] : model)
    if (v != 0) nonzero[row] = v;
  CHECK(seen == nonzero) << "ForEach saw " << seen.size() << " rows, model has " << nonzero.size();
  // Fill over ranges that start and end inside chunks.
  std::mt19937_64 rng(rows);
  for (int k = 0; k < 20; ++k) {
    const uint64_t first_row = rng() % rows;
    const uint64_t n = std::min<uint64_t>(rows - first_row, 1 + rng() % 9000);
    std::vector<uint64_t> out(n, 77);
    m.Fill(first_row, n, out.data());
    for (uint64_t i = 0; i < n; ++i) {
      auto it = model.find(first_row + i);
      const uint64_t want = it == model.end() ? 0 : it->second;
      CHECK(out[i] == want) << "Fill row " << first_row + i << ": " << out[i] << " != " << want;
    }
  }
}

void TestRandomAgainstModel(uint64_t rows, uint64_t max_value, uint64_t sets, uint64_t hot) {
  LocationMap m(rows, max_value);
  std::map<uint64_t, uint64_t> model;
  std::mt19937_64 rng(rows ^ max_value);
  for (uint64_t i = 0; i < sets; ++i) {
    // Half the sets go to a few hot chunks, so that some turn dense.
    const uint64_t row = (i % 2 == 0) ? rng() % std::min(rows, hot) : rng() % rows;
    const uint64_t v = (rng() % 16 == 0) ? 0 : 1 + rng() % max_value;
    m.Set(row, v);
    if (v != 0 || model.count(row)) model[row] = v;
  }
  CHECK(m.Get(rows - 1) == (model.count(rows - 1) ? model[rows - 1] : 0));
  CheckAgainstModel(m, model, rows);
  m.Set(rows - 1, max_value);  // the largest value, in the last (possibly short) chunk
  model[rows - 1] = max_value;
  CHECK(m.Get(rows - 1) == max_value);
  CheckAgainstModel(m, model, rows);
}

void TestWidths() {
  for (uint64_t max_value : {uint64_t(1), uint64_t(1000), uint64_t(1) << 30, (uint64_t(1) << 32) - 1,
                             uint64_t(1) << 32, uint64_t(1) << 45, (uint64_t(1) << 56) - 1,
                             uint64_t(1) << 60, ~uint64_t(0)}) {
    TestRandomAgainstModel(100000, max_value, 60000, 9000);
    TestRandomAgainstModel(5000, max_value, 20000, 5000);
    TestRandomAgainstModel(7, max_value, 50, 7);
  }
}

void TestMemory() {
  // Sparse: 10^8 rows, 10^5 written: far below a byte per row.
  {
    const uint64_t rows = 100000000;
    LocationMap m(rows, uint64_t(1) << 28);
    std::mt19937_64 rng(1);
    for (int i = 0; i < 100000; ++i) m.Set(rng() % rows, 1 + rng() % 1000);
    const double per_row = double(m.MemoryBytes()) / rows;
    CHECK(per_row < 0.05) << "sparse map costs " << per_row << " B/row";
    CHECK(m.dense_chunks() == 0);
  }
  // Dense: every row written: the packed width (29 bits) plus a little.
  {
    const uint64_t rows = 3000000;
    LocationMap m(rows, uint64_t(1) << 28);
    for (uint64_t r = 0; r < rows; ++r) m.Set(r, 1 + (r * 2654435761u) % (uint64_t(1) << 28));
    const double per_row = double(m.MemoryBytes()) / rows;
    CHECK(m.value_bits() == 29) << m.value_bits();
    CHECK(per_row <= 29.0 / 8 + 0.05) << "dense map costs " << per_row << " B/row";
    CHECK(m.sparse_chunks() == 0) << m.sparse_chunks();
    for (uint64_t r = 0; r < rows; r += 977) CHECK(m.Get(r) == 1 + (r * 2654435761u) % (uint64_t(1) << 28));
  }
}

// Rows written at random across the table grow every chunk together (4, 8, ..., 256
// entries): each size's blocks are left behind at about the same time, and nothing asks
// for them again. The map hands those back rather than keep them: its memory stays near
// its live chunks' (6 B a written row at 4-byte values, sparse chunks about 3/4 full), where
// keeping every left-behind block costs about twice that.
void TestLeftBehindBlocksAreHandedBack() {
  const uint64_t rows = 20000000, sets = 1000000;  // ~200 rows a chunk: each chunk at 256 entries
  LocationMap m(rows, uint64_t(1) << 28);
  std::unordered_map<uint64_t, uint64_t> model;
  model.reserve(sets);
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < sets; ++i) {
    const uint64_t row = rng() % rows, v = 1 + rng() % (uint64_t(1) << 28);
    m.Set(row, v);
    model[row] = v;
  }
  CHECK(m.dense_chunks() == 0) << m.dense_chunks();
  uint64_t seen = 0;
  m.ForEach([&](uint64_t row, uint64_t v) {
    auto it = model.find(row);
    CHECK(it != model.end() && it->second == v) << "row " << row << " holds " << v;
    ++seen;
  });
  CHECK(seen == model.size()) << seen << " rows seen, " << model.size() << " written";
  const double per_written = double(m.MemoryBytes()) / double(model.size());
  CHECK(per_written < 9.0) << "the map keeps " << per_written << " B a written row";
}

}  // namespace
}  // namespace mtrains

int main() {
  using namespace mtrains;
  Run("location map: random sets vs model at every width", TestWidths);
  Run("location map: memory of sparse and dense tables", TestMemory);
  Run("location map: blocks left behind by growing chunks are handed back", TestLeftBehindBlocksAreHandedBack);
  std::fprintf(stderr, "test_location_map: all passed\n");
  return 0;
}
