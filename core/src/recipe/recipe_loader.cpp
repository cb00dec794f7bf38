#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "recipe/closest_match.h"
#include "recipe/core_schema.h"
#include "recipe/recipe.h"
#include "recipe/toml_key_depth.h"

namespace kiln {
namespace fs = std::filesystem;

namespace {

// One key's value as read, before validation: where it came from and the file it is relative to.
struct RawValue {
  RecipeValue value;
  std::string type_name;  // the TOML type as written, for error messages
  std::string origin;     // "configs/x.toml:12" or "--set kv.layout=fp8"
  fs::path base_dir;      // for relative paths
};
using RawRecipe = std::map<std::string, RawValue>;  // "section.key" → value

std::string at(const std::string& file, const toml::source_region& src) {
  return file + ":" + std::to_string(src.begin.line);
}

Result<RawValue> convert(const toml::node& node, const std::string& full_key, const std::string& origin) {
  RawValue v;
  v.origin = origin;
  if (auto s = node.as_string()) {
    v.value = s->get();
    v.type_name = "string";
  } else if (auto i = node.as_integer()) {
    v.value = i->get();
    v.type_name = "integer";
  } else if (auto f = node.as_floating_point()) {
    v.value = f->get();
    v.type_name = "float";
  } else if (auto b = node.as_boolean()) {
    v.value = b->get();
    v.type_name = "boolean";
  } else if (auto t = node.as_table()) {
    StringTable st;
    for (auto&& [k, sub] : *t) {
      auto ss = sub.as_string();
      if (!ss)
        return invalid_argument("`" + full_key + "." + std::string(k.str()) + "` in " + origin +
                                ": values of this table must be strings");
      st[std::string(k.str())] = ss->get();
    }
    v.value = std::move(st);
    v.type_name = "table";
  } else if (node.is_array()) {
    return invalid_argument("`" + full_key + "` in " + origin + ": arrays are not accepted here");
  } else {
    return invalid_argument("`" + full_key + "` in " + origin + ": dates and times are not accepted here");
  }
  return v;
}

std::vector<std::string> all_known_keys(const Registry& registry) {
  std::vector<std::string> keys;
  for (const auto& sec : core_sections()) {
    for (const auto& k : sec.schema.keys) keys.push_back(sec.name + "." + k.name);
    if (sec.selector_key)
      for (const auto* e : registry.list(sec.selector_kind))
        for (const auto& k : e->schema.keys) keys.push_back(sec.name + "." + k.name);
  }
  return keys;
}

Status unknown_key(const std::string& full_key, const std::string& origin, const Registry& registry) {
  std::string msg = "unknown key `" + full_key + "` in " + origin;
  if (auto m = closest_match(full_key, all_known_keys(registry))) msg += " — did you mean `" + *m + "`?";
  else msg += " (configs/README.md lists every key)";
  return invalid_argument(msg);
}

// A key of a selector section that neither the core nor the selected plugin (`owner`) takes: say who would take it
// (another loaded plugin of the kind, or one kiln does not have yet) before falling back to a spelling suggestion.
Status key_not_taken(const CoreSection& sec, const CapabilityEntry& owner, const std::string& key,
                     const std::string& full_key, const std::string& origin, const Registry& registry) {
  const std::string kind = plugin_kind_name(sec.selector_kind);
  const std::string prefix = "unknown key `" + full_key + "` in " + origin + ": the " + kind + " `" + owner.name + "`";
  std::string takers;
  for (const auto* e : registry.list(sec.selector_kind))
    if (e->schema.find(key)) takers += (takers.empty() ? "" : ", ") + ("`" + e->name + "`");
  if (!takers.empty())
    return invalid_argument(prefix + " does not take it; it belongs to the " + kind + " " + takers + " (set `" +
                            sec.name + "." + *sec.selector_key + "`)");
  if (const UnprovidedKey* u = find_unprovided_key(sec, key))
    return invalid_argument(prefix + " does not take it (" + u->doc + "), and " + u->missing);
  Status s = unknown_key(full_key, origin, registry);
  if (!closest_match(full_key, all_known_keys(registry)))
    s = invalid_argument(s.message() + "; the " + kind + " `" + owner.name + "` does not take it");
  return s;
}

// Reads `file` and the files it extends into `out`. Returns what stops reading (a missing file, invalid TOML, an
// `extends` cycle); a key that cannot be read is added to `problems` and reading goes on.
Status read_layer(const fs::path& file, std::vector<fs::path>& stack, RawRecipe& out, std::vector<fs::path>& sources,
                  const Registry& registry, std::vector<Status>& problems) {
  std::error_code ec;
  fs::path canon = fs::weakly_canonical(file, ec);
  for (const auto& f : stack)
    if (f == canon) {
      std::string chain;
      for (const auto& s : stack) chain += s.string() + " → ";
      return invalid_argument("`extends` cycle: " + chain + canon.string());
    }
  if (!fs::exists(file, ec)) return not_found("recipe file " + file.string() + " does not exist");
  const std::string name = file.string();

  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found("recipe file " + name + " cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  const std::string content = text.str();
  KILN_RETURN_IF_ERROR(check_toml_key_depth(content, name));
  toml::table root;
  try {
    root = toml::parse(content, name);
  } catch (const toml::parse_error& e) {
    return invalid_argument(at(name, e.source()) + ":" + std::to_string(e.source().begin.column) +
                            ": invalid TOML: " + std::string(e.description()));
  }

  stack.push_back(canon);
  if (auto ext = root.get("extends")) {
    auto s = ext->as_string();
    if (!s) return invalid_argument("`extends` in " + at(name, ext->source()) + ": expected a string (a recipe path)");
    fs::path base = file.parent_path() / s->get();
    KILN_RETURN_IF_ERROR(read_layer(base.lexically_normal(), stack, out, sources, registry, problems)
                             .with_context("extended by " + at(name, ext->source())));
  }
  stack.pop_back();
  sources.push_back(file);

  for (auto&& [key, node] : root) {
    std::string section(key.str());
    if (section == "extends") continue;
    auto* tbl = node.as_table();
    if (!tbl) {
      std::string origin = at(name, node.source());
      Status s = unknown_key(section, origin, registry);
      problems.push_back(invalid_argument(s.message() + " — top-level keys belong in a section such as [model]"));
      continue;
    }
    for (auto&& [k, v] : *tbl) {
      std::string full = section + "." + std::string(k.str());
      Result<RawValue> raw = convert(v, full, at(name, v.source()));
      if (!raw.ok()) {
        problems.push_back(raw.status());
        out.erase(full);  // a value the file failed to set must not fall back to an earlier layer's
        continue;
      }
      raw->base_dir = file.parent_path();
      out[full] = std::move(raw).value();
    }
  }
  return ok_status();
}

Status apply_override(const std::string& arg, RawRecipe& out) {
  size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0)
    return invalid_argument("--set `" + arg + "`: expected section.key=value");
  std::string key = arg.substr(0, eq);
  std::string text = arg.substr(eq + 1);
  if (key.find('.') == std::string::npos || key.front() == '.' || key.back() == '.')
    return invalid_argument("--set `" + arg + "`: the key must be section.key (e.g. speculative.depth=3)");
  std::string origin = "--set " + arg;
  // The value is read as TOML (3, 0.5, true, "x", {A="1"}); anything that is not valid TOML is a bare string.
  RawValue raw;
  KILN_RETURN_IF_ERROR(check_toml_key_depth("v = " + text, origin));  // a value may hold newlines and a deep header
  try {
    toml::table t = toml::parse("v = " + text);
    KILN_ASSIGN_OR_RETURN(raw, convert(*t.get("v"), key, origin));
  } catch (const toml::parse_error&) {
    raw.value = text;
    raw.type_name = "string";
    raw.origin = origin;
  }
  raw.base_dir = fs::current_path();
  out[key] = std::move(raw);
  return ok_status();
}

// Type-checks and normalises one value against its KeySpec.
Result<RecipeValue> check_value(const KeySpec& spec, RawValue raw, const std::string& full_key) {
  auto fail = [&](const std::string& what) { return invalid_argument("`" + full_key + "` in " + raw.origin + ": " + what); };
  RecipeValue v = raw.value;
  switch (spec.type) {
    case ValueType::kString:
      if (!std::holds_alternative<std::string>(v)) return fail("expected a string, got " + raw.type_name);
      break;
    case ValueType::kInteger:
      if (!std::holds_alternative<int64_t>(v)) return fail("expected an integer, got " + raw.type_name + " " + render_recipe_value(v));
      break;
    case ValueType::kFloat:
      if (auto* i = std::get_if<int64_t>(&v)) v = static_cast<double>(*i);
      else if (!std::holds_alternative<double>(v)) return fail("expected a number, got " + raw.type_name + " " + render_recipe_value(v));
      break;
    case ValueType::kBool:
      if (!std::holds_alternative<bool>(v)) return fail("expected true or false, got " + raw.type_name + " " + render_recipe_value(v));
      break;
    case ValueType::kStringTable:
      if (!std::holds_alternative<StringTable>(v)) return fail("expected a table of strings, got " + raw.type_name);
      break;
  }
  if (!spec.allowed.empty()) {
    const auto& s = std::get<std::string>(v);
    bool ok = false;
    for (const auto& a : spec.allowed) ok = ok || a == s;
    if (!ok) {
      std::string list;
      for (const auto& a : spec.allowed) list += (list.empty() ? "" : ", ") + a;
      std::string msg = "`" + s + "` is not one of: " + list;
      if (auto m = closest_match(s, spec.allowed)) msg += " — did you mean `" + *m + "`?";
      return fail(msg);
    }
  }
  if (const double* d = std::get_if<double>(&v); d && !std::isfinite(*d))
    return fail(render_recipe_value(v) + " is not a finite number");
  if (spec.min || spec.max) {
    double x = std::holds_alternative<int64_t>(v) ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
    if (spec.min && x < *spec.min) return fail(render_recipe_value(v) + " is below the minimum " + render_recipe_value(RecipeValue(*spec.min)));
    if (spec.max && x > *spec.max) return fail(render_recipe_value(v) + " is above the maximum " + render_recipe_value(RecipeValue(*spec.max)));
  }
  if (spec.is_path) {
    auto& s = std::get<std::string>(v);
    if (!s.empty() && fs::path(s).is_relative()) s = (raw.base_dir / s).lexically_normal().string();
  }
  return v;
}

}  // namespace

std::string render_recipe_value(const RecipeValue& v) {
  if (auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) {
    std::ostringstream o;
    o << *d;
    return o.str();
  }
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  const auto& t = std::get<StringTable>(v);
  std::string out = "{";
  for (const auto& [k, val] : t) out += (out.size() > 1 ? ", " : " ") + k + " = \"" + val + "\"";
  return out + (t.empty() ? "}" : " }");
}

const RecipeSection& Recipe::section(const std::string& name) const {
  static const RecipeSection kEmpty;
  auto it = sections.find(name);
  return it == sections.end() ? kEmpty : it->second;
}

std::string Recipe::to_toml() const {
  toml::table root;
  for (const auto& sec : core_sections()) {
    auto it = sections.find(sec.name);
    if (it == sections.end()) continue;
    toml::table t;
    for (const auto& [k, v] : it->second.values()) {
      if (auto* s = std::get_if<std::string>(&v)) t.insert(k, *s);
      else if (auto* i = std::get_if<int64_t>(&v)) t.insert(k, *i);
      else if (auto* d = std::get_if<double>(&v)) t.insert(k, *d);
      else if (auto* b = std::get_if<bool>(&v)) t.insert(k, *b);
      else if (auto* st = std::get_if<StringTable>(&v)) {
        toml::table inner;
        for (const auto& [ik, iv] : *st) inner.insert(ik, iv);
        inner.is_inline(true);
        t.insert(k, std::move(inner));
      }
    }
    root.insert(sec.name, std::move(t));
  }
  std::ostringstream out;
  out << "# resolved from " << file.string();
  for (const auto& o : overrides) out << " --set " << o;
  out << "\n" << toml::toml_formatter(root, toml::toml_formatter::default_flags & ~toml::format_flags::indentation)
      << "\n";
  return out.str();
}

namespace {

// Settings that contradict each other. (parallel.tensor > 1 and parallel.decode_context > 1 run on CPU ranks; the
// architecture and device refuse what they cannot shard when the model loads.)
void refuse_inconsistent(const Recipe& recipe, std::vector<Status>& problems) {
  const RecipeSection& parallel = recipe.section("parallel");
  const int64_t tensor = parallel.get_int("tensor", 1), dcp = parallel.get_int("decode_context", 1);
  if (dcp > 1 && tensor % dcp != 0)
    problems.push_back(parallel.error(
        "decode_context", std::to_string(dcp) + " does not divide parallel.tensor = " + std::to_string(tensor) +
                              ": a decode-context group is decode_context consecutive tensor-parallel ranks (set "
                              "tensor to a multiple of it)"));
}

}  // namespace

RecipeRead read_recipe(const fs::path& file, const std::vector<std::string>& overrides, const Registry& registry) {
  RecipeRead read;
  std::vector<Status>& problems = read.problems;
  Recipe recipe;
  recipe.file = file;
  recipe.overrides = overrides;
  RawRecipe raw;
  std::vector<fs::path> stack;
  if (!file.empty()) {
    Status s = read_layer(file, stack, raw, recipe.sources, registry, problems);
    if (!s.ok()) {
      problems.push_back(s);
      return read;
    }
  }
  for (const auto& o : overrides)
    if (Status s = apply_override(o, raw); !s.ok()) problems.push_back(s);

  // Which plugin owns the rest of each selector section (none when the selector names no plugin: its other keys
  // cannot be judged then, and are left unchecked rather than all reported unknown).
  std::map<std::string, const CapabilityEntry*> owners;
  std::map<std::string, bool> owner_unknown;
  for (const auto& sec : core_sections()) {
    if (!sec.selector_key) continue;
    std::string full = sec.name + "." + *sec.selector_key;
    const KeySpec* spec = sec.schema.find(*sec.selector_key);
    std::string chosen = std::get<std::string>(*spec->default_value);
    std::string origin = "default";
    auto it = raw.find(full);
    if (it != raw.end()) {
      Result<RecipeValue> v = check_value(*spec, it->second, full);
      if (!v.ok()) {  // reported with the section's other keys below
        owner_unknown[sec.name] = true;
        continue;
      }
      chosen = std::get<std::string>(*v);
      origin = it->second.origin;
    }
    const CapabilityEntry* e = registry.find(sec.selector_kind, chosen);
    if (!e) {
      std::vector<std::string> names = registry.names(sec.selector_kind);
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      std::string msg = "`" + full + "` in " + origin + ": no plugin provides " + plugin_kind_name(sec.selector_kind) +
                        " `" + chosen + "` (available: " + (list.empty() ? "none" : list) + ")";
      if (auto m = closest_match(chosen, names)) msg += " — did you mean `" + *m + "`?";
      else msg += "; `kiln plugins` shows what loaded and why files were refused";
      problems.push_back(not_found(msg));
      owner_unknown[sec.name] = true;
      continue;
    }
    owners[sec.name] = e;
  }

  // Keys that failed validation: left without a value, default included.
  std::map<std::string, bool> failed;
  for (const auto& sec : core_sections()) recipe.sections.emplace(sec.name, RecipeSection(sec.name));
  for (auto& [full, value] : raw) {
    size_t dot = full.find('.');
    std::string section = full.substr(0, dot), key = full.substr(dot + 1);
    const CoreSection* sec = find_core_section(section);
    if (!sec) {
      problems.push_back(unknown_key(full, value.origin, registry));
      continue;
    }
    const KeySpec* spec = sec->schema.find(key);
    if (!spec && owners.count(section)) spec = owners[section]->schema.find(key);
    if (!spec) {
      failed[full] = true;
      if (owner_unknown.count(section)) continue;
      problems.push_back(owners.count(section)
                             ? key_not_taken(*sec, *owners[section], key, full, value.origin, registry)
                             : unknown_key(full, value.origin, registry));
      continue;
    }
    std::string origin = value.origin;
    Result<RecipeValue> v = check_value(*spec, std::move(value), full);
    if (!v.ok()) {
      problems.push_back(v.status());
      failed[full] = true;
      continue;
    }
    recipe.sections[section].set(key, std::move(v).value(), origin);
  }

  // Defaults, and required keys that are still missing.
  for (const auto& sec : core_sections()) {
    RecipeSection& rs = recipe.sections[sec.name];
    std::vector<const KeySpec*> specs;
    for (const auto& k : sec.schema.keys) specs.push_back(&k);
    if (owners.count(sec.name))
      for (const auto& k : owners[sec.name]->schema.keys)
        if (!sec.schema.find(k.name)) specs.push_back(&k);
    for (const KeySpec* k : specs) {
      if (rs.has(k->name) || failed.count(sec.name + "." + k->name)) continue;
      if (k->required)
        problems.push_back(invalid_argument("missing required key `" + sec.name + "." + k->name + "` in " +
                                            (file.empty() ? std::string("the command line") : file.string()) + " (" +
                                            k->doc + ")"));
      else if (k->default_value)
        rs.set(k->name, *k->default_value, "default");
    }
  }
  refuse_inconsistent(recipe, problems);
  read.recipe = std::move(recipe);
  return read;
}

Result<Recipe> load_recipe(const fs::path& file, const std::vector<std::string>& overrides, const Registry& registry) {
  RecipeRead read = read_recipe(file, overrides, registry);
  if (!read.problems.empty()) return join_problems(read.problems);
  return std::move(*read.recipe);
}

Status join_problems(const std::vector<Status>& problems) {
  if (problems.empty()) return ok_status();
  std::string message;
  for (const Status& p : problems) message += (message.empty() ? "" : "\n") + p.message();
  return Status(problems.front().code(), message);
}

}  // namespace kiln
