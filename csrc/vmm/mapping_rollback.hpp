// MappingRollback: the RAII guard of a multi-step mapping in the page table.
//
// Owns: the list of ranges a step mapped so far, unmapped again (errors ignored: the step's own
// error is the one reported) unless the step commits.
// Invariants: used only by PageTable (page_table.cpp, page_table_side.cpp), the one owner of
// mappings; after commit() it does nothing.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.hpp"

namespace vta {

class MappingRollback {
 public:
  // Room for the `ranges` a step will map, made before its first driver call: noting one
  // (mapped_one) cannot throw then, so a range mapped is always undone.
  MappingRollback(Backend& backend, size_t ranges) : backend_(backend) { mapped_.reserve(ranges); }
  MappingRollback(const MappingRollback&) = delete;
  MappingRollback& operator=(const MappingRollback&) = delete;
  ~MappingRollback() {
    if (committed_) return;
    for (auto& [va, bytes] : mapped_) (void)backend_.unmap(va, bytes);
  }
  void mapped_one(uintptr_t va, uint64_t bytes) { mapped_.push_back({va, bytes}); }
  void commit() { committed_ = true; }

 private:
  Backend& backend_;
  std::vector<std::pair<uintptr_t, uint64_t>> mapped_;
  bool committed_ = false;
};

}  // namespace vta
