// RegionTags: the process's region tags, the names users give regions ("weights", "kv_cache"),
// each interned once as a small id that allocations carry (docs/design.md, glossary: region).
//
// Owns: the one table of tag names of the process, shared by every address space (so one tag
// names a region in every space: torch's, one per device, pause together), the rule a name
// follows, and the bound on how many there may be.
// Invariants: id 0 is "no region" and has no name; a name, once interned, keeps its id for the
// life of the process (names are never forgotten, so an allocation's tag never dangles); at most
// kMaxRegionTags names; every call is thread-safe (one mutex, held for the table only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vta {

constexpr uint32_t kMaxRegionTags = 4096;
constexpr size_t kMaxRegionTagBytes = 64;

// The id of tag `name`, interned on first use: 1 to kMaxRegionTagBytes letters, digits and
// `. _ - : / @ +`, a letter or digit first. Throws InvalidArgument for another name, or when
// kMaxRegionTags names are interned already.
uint32_t region_tag_id(const char* name);
// The name of tag `id`; empty for 0 or an id never handed out.
std::string region_tag_name(uint32_t id);
// Whether `id` is 0 or an id handed out (InvalidArgument otherwise, naming `what`).
void check_region_tag(uint32_t id, const char* what);

}  // namespace vta
