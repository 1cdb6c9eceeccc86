// RegionTags: the process's table of region tag names (see region_tags.hpp).
//
// Owns: nothing beyond region_tags.hpp's table.
// Invariants: those of region_tags.hpp; the table is a function-local static that is never
// destroyed (a tag may be asked for from PyTorch's static destruction, as the torch shim's
// spaces are), and the mutex guards it alone.
#include "alloc/region_tags.hpp"

#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/status.hpp"

namespace vta {
namespace {

struct Table {
  std::mutex mu;
  std::vector<std::string> names{std::string()};  // by id; 0 has none
  std::unordered_map<std::string, uint32_t> ids;
};

Table& table() {
  static Table* t = new Table();  // immortal: see the header comment
  return *t;
}

bool allowed(char c, bool first) {
  bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  return alnum || (!first && std::strchr("._-:/@+", c) != nullptr && c != '\0');
}

}  // namespace

uint32_t region_tag_id(const char* name) {
  if (!name) fail(VTA_ERR_INVALID_ARGUMENT, "null region tag");
  size_t n = strnlen(name, kMaxRegionTagBytes + 1);
  if (n == 0 || n > kMaxRegionTagBytes)
    fail(VTA_ERR_INVALID_ARGUMENT, "a region tag is 1 to " + std::to_string(kMaxRegionTagBytes) + " characters");
  for (size_t i = 0; i < n; ++i)
    if (!allowed(name[i], i == 0))
      fail(VTA_ERR_INVALID_ARGUMENT, "region tag: use letters, digits and . _ - : / @ +, starting with a letter or digit");
  std::string key(name, n);
  Table& t = table();
  std::lock_guard<std::mutex> lk(t.mu);
  auto it = t.ids.find(key);
  if (it != t.ids.end()) return it->second;
  if (t.names.size() > kMaxRegionTags)
    fail(VTA_ERR_INVALID_ARGUMENT, "too many region tags in this process (at most " + std::to_string(kMaxRegionTags) + ")");
  uint32_t id = static_cast<uint32_t>(t.names.size());
  t.names.push_back(key);
  t.ids.emplace(std::move(key), id);
  return id;
}

std::string region_tag_name(uint32_t id) {
  Table& t = table();
  std::lock_guard<std::mutex> lk(t.mu);
  return id < t.names.size() ? t.names[id] : std::string();
}

void check_region_tag(uint32_t id, const char* what) {
  Table& t = table();
  std::lock_guard<std::mutex> lk(t.mu);
  if (id >= t.names.size())
    fail(VTA_ERR_INVALID_ARGUMENT, std::string(what) + ": no region tag has id " + std::to_string(id));
}

}  // namespace vta
