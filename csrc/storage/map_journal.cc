#include "storage/map_journal.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace mtrains {
namespace {

constexpr uint32_t kPayloadBytes = kJournalBlockBytes - kJournalHeaderBytes;
constexpr uint32_t kMaxRecordBytes = 20;  // two varints of at most 10 bytes
constexpr uint64_t kFirstReadBlocks = 8, kMaxReadBlocks = 2048;  // replay reads: 32 KiB .. 8 MiB

size_t PutVarint(uint8_t* p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  p[n++] = static_cast<uint8_t>(v);
  return n;
}

bool GetVarint(const uint8_t* p, size_t len, size_t* pos, uint64_t* v) {
  uint64_t x = 0;
  for (uint32_t shift = 0; shift < 64 && *pos < len; shift += 7) {
    const uint8_t b = p[(*pos)++];
    x |= uint64_t(b & 0x7F) << shift;
    if ((b & 0x80) == 0) {
      *v = x;
      return true;
    }
  }
  return false;
}

uint64_t ZigZag(int64_t v) { return (uint64_t(v) << 1) ^ uint64_t(v >> 63); }
int64_t UnZigZag(uint64_t v) { return int64_t(v >> 1) ^ -int64_t(v & 1); }

}  // namespace

MapJournal::MapJournal(const TableHeader& header, Device* meta)
    : h_(header), meta_(meta), capacity_(header.JournalCapacity()), rng_(std::random_device{}()) {}

Status MapJournal::ReadBlocks(uint64_t pos, uint64_t n, AlignedBuffer* buf) {
  IoOp op{BlockOffset(pos), buf->data(), static_cast<uint32_t>(n * kJournalBlockBytes)};
  return meta_->Read(&op, 1);
}

Status MapJournal::Replay(const std::function<void(uint64_t row, uint64_t value)>& apply) {
  AlignedBuffer desc(kJournalBlockBytes, 4096);
  IoOp op{h_.journal_offset, desc.data(), kJournalBlockBytes};
  MTRAINS_RETURN_IF_ERROR(meta_->Read(&op, 1));
  MTRAINS_RETURN_IF_ERROR(DecodeJournalDescriptor(desc.data(), h_.table_uuid, &epoch_, &checkpoint_pending_)
                              .WithContext("map journal at offset " + std::to_string(h_.journal_offset)));
  const uint64_t slots = h_.LogSlots();
  std::vector<MapRecord> commit;  // records of the commit being read
  bool in_commit = false;
  uint64_t commit_start = 0, nonce = 0, complete_end = 0;
  bool damaged = false;
  uint64_t pos = 0, chunk = kFirstReadBlocks;
  AlignedBuffer buf(std::min(kMaxReadBlocks, capacity_) * kJournalBlockBytes, 4096);
  bool done = false;
  while (!done && pos < capacity_) {
    const uint64_t n = std::min(chunk, capacity_ - pos);
    MTRAINS_RETURN_IF_ERROR(ReadBlocks(pos, n, &buf));
    chunk = std::min(chunk * 2, kMaxReadBlocks);
    for (uint64_t i = 0; i < n; ++i, ++pos) {
      const uint8_t* b = buf.data() + i * kJournalBlockBytes;
      JournalBlockHeader hdr;
      bool zero = false, torn = false;
      const Status st = VerifyJournalBlock(b, h_.table_uuid, &hdr, &zero, &torn);
      const std::string where = "map journal block at offset " + std::to_string(BlockOffset(pos));
      // An intact block of another table, or misplaced, was never written here by a Commit.
      if (!st.ok() && !torn) return st.WithContext(where);
      if (st.ok() && !zero && hdr.epoch == epoch_ && hdr.position != pos)
        return Status::Corruption(where + ": the block claims position " + std::to_string(hdr.position));
      if (zero || (st.ok() && hdr.epoch != epoch_)) {
        done = true;  // never written, or left by an older epoch: the end
        break;
      }
      if (!st.ok()) {
        damaged = true;
        done = true;
        break;
      }
      if (in_commit ? (hdr.nonce != nonce || hdr.start != commit_start) : hdr.start != pos) {
        // Not the continuation of the open commit (a block of an abandoned one), or a
        // stale block that does not start a commit here: the end either way.
        done = true;
        break;
      }
      if (!in_commit) {
        in_commit = true;
        commit_start = pos;
        nonce = hdr.nonce;
        commit.clear();
      }
      const uint8_t* p = b + kJournalHeaderBytes;
      size_t at = 0;
      uint64_t row = 0, value = 0;
      bool first = true;
      while (at < hdr.payload) {
        uint64_t drow, dvalue;
        if (!GetVarint(p, hdr.payload, &at, &drow) || !GetVarint(p, hdr.payload, &at, &dvalue))
          return Status::Corruption(where + ": truncated record");
        row = first ? drow : row + drow;
        value = uint64_t(int64_t(value) + UnZigZag(dvalue));
        if ((!first && drow == 0) || row >= h_.num_rows || value == 0 || value > slots)
          return Status::Corruption(where + ": record row " + std::to_string(row) + " -> slot " +
                                    std::to_string(value - 1) + " is out of range (rows " +
                                    std::to_string(h_.num_rows) + ", slots " + std::to_string(slots) + ")");
        first = false;
        commit.push_back({row, value});
      }
      if (hdr.last) {
        for (const MapRecord& r : commit) apply(r.row, r.value);
        in_commit = false;
        complete_end = pos + 1;
      }
    }
  }
  end_ = complete_end;
  if (damaged) return CheckTail(pos, complete_end);
  return Status::Ok();
}

Status MapJournal::CheckTail(uint64_t bad, uint64_t complete_end) {
  AlignedBuffer buf(std::min(kMaxReadBlocks, capacity_) * kJournalBlockBytes, 4096);
  uint64_t pos = bad + 1, chunk = kFirstReadBlocks;
  while (pos < capacity_) {
    const uint64_t n = std::min(chunk, capacity_ - pos);
    MTRAINS_RETURN_IF_ERROR(ReadBlocks(pos, n, &buf));
    chunk = std::min(chunk * 2, kMaxReadBlocks);
    for (uint64_t i = 0; i < n; ++i, ++pos) {
      JournalBlockHeader hdr;
      bool zero = false, torn = false;
      const Status st = VerifyJournalBlock(buf.data() + i * kJournalBlockBytes, h_.table_uuid, &hdr, &zero, &torn);
      if (!st.ok() && !torn)
        return st.WithContext("map journal block at offset " + std::to_string(BlockOffset(pos)));
      if (zero || (st.ok() && hdr.epoch != epoch_)) return Status::Ok();
      if (st.ok() && hdr.position == pos && hdr.start > complete_end)
        return Status::Corruption("map journal block at offset " + std::to_string(BlockOffset(bad)) +
                                  " is damaged, and a later commit (block at offset " +
                                  std::to_string(BlockOffset(pos)) + ") follows it");
    }
  }
  return Status::Ok();
}

uint64_t MapJournal::Encode(const std::vector<MapRecord>& records, AlignedBuffer* out) {
  // Upper bound of the blocks: every block takes at least kPayloadBytes / kMaxRecordBytes records.
  const uint64_t per_block = kPayloadBytes / kMaxRecordBytes;
  const uint64_t max_blocks = std::max<uint64_t>(1, (records.size() + per_block - 1) / per_block);
  if (out->size() < max_blocks * kJournalBlockBytes) *out = AlignedBuffer(max_blocks * kJournalBlockBytes, 4096);
  const uint64_t nonce = rng_();
  uint64_t blocks = 0;
  size_t i = 0;
  do {
    uint8_t* b = out->data() + blocks * kJournalBlockBytes;
    std::memset(b, 0, kJournalBlockBytes);
    uint8_t* p = b + kJournalHeaderBytes;
    uint32_t len = 0;
    uint64_t row = 0, value = 0;
    for (; i < records.size() && len + kMaxRecordBytes <= kPayloadBytes; ++i) {
      len += PutVarint(p + len, records[i].row - row);
      len += PutVarint(p + len, ZigZag(int64_t(records[i].value - value)));
      row = records[i].row;
      value = records[i].value;
    }
    JournalBlockHeader hdr;
    hdr.uuid = h_.table_uuid;
    hdr.epoch = epoch_;
    hdr.position = end_ + blocks;
    hdr.start = end_;
    hdr.nonce = nonce;
    hdr.last = i == records.size() ? 1 : 0;
    hdr.payload = len;
    SealJournalBlock(b, hdr);
    ++blocks;
  } while (i < records.size());
  return blocks;
}

Status MapJournal::Append(const AlignedBuffer& encoded, uint64_t blocks, bool has_records) {
  if (!Fits(blocks)) return Status::InvalidArgument("map journal region is full");
  std::vector<IoOp> ops;  // 8 MiB each: an IoOp's length is 32 bits
  for (uint64_t b = 0; b < blocks; b += kMaxReadBlocks) {
    const uint64_t n = std::min(kMaxReadBlocks, blocks - b);
    ops.push_back({BlockOffset(end_ + b), const_cast<uint8_t*>(encoded.data()) + b * kJournalBlockBytes,
                   static_cast<uint32_t>(n * kJournalBlockBytes)});
  }
  MTRAINS_RETURN_IF_ERROR(meta_->Write(ops.data(), ops.size()));
  end_ += blocks;
  last_has_records_ = has_records;
  return Status::Ok();
}

Status MapJournal::MarkCheckpointPending() {
  AlignedBuffer desc(kJournalBlockBytes, 4096);
  EncodeJournalDescriptor(desc.data(), h_.table_uuid, epoch_, true);
  IoOp op{h_.journal_offset, desc.data(), kJournalBlockBytes};
  MTRAINS_RETURN_IF_ERROR(meta_->Write(&op, 1));
  checkpoint_pending_ = true;
  return Status::Ok();
}

Status MapJournal::StartEpoch() {
  AlignedBuffer desc(kJournalBlockBytes, 4096);
  EncodeJournalDescriptor(desc.data(), h_.table_uuid, epoch_ + 1);
  IoOp op{h_.journal_offset, desc.data(), kJournalBlockBytes};
  MTRAINS_RETURN_IF_ERROR(meta_->Write(&op, 1));
  ++epoch_;
  end_ = 0;
  last_has_records_ = false;
  checkpoint_pending_ = false;
  return Status::Ok();
}

}  // namespace mtrains
