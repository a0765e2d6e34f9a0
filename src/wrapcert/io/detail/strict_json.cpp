#include <wrapcert/error.h>
#include <wrapcert/io/detail/input_file.h>
#include <wrapcert/io/detail/strict_json.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace wrapcert::detail {
namespace {

using json = nlohmann::ordered_json;

/// Builds the document through nlohmann's SAX interface. Its own DOM parser inserts each key of
/// an ordered object by searching the keys before it (quadratic: a 300,000-key header took
/// minutes); here a key is appended, and each object is checked for a repeated key once it is
/// complete, by sorting pointers to its keys.
class StrictBuilder final : public nlohmann::json_sax<json> {
 public:
  json& result() { return root_; }
  const std::string& repeated() const { return repeated_; }
  const std::string& error() const { return error_; }

  bool null() override { return add(json(nullptr)); }
  bool boolean(bool v) override { return add(json(v)); }
  bool number_integer(number_integer_t v) override { return add(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return add(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return add(json(v)); }
  bool string(string_t& v) override { return add(json(std::move(v))); }
  bool binary(binary_t& v) override { return add(json::binary(std::move(v))); }
  bool start_object(std::size_t) override {
    open_.push_back(add_container(json::object()));
    keys_.emplace_back();
    members_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    keys_.back() = k;
    return true;
  }
  bool end_object() override {
    // The members move in once: an ordered object's own vector copies its const keys and
    // their values whenever it grows.
    auto& members = members_.back();
    auto& object = *open_.back()->get_ptr<json::object_t*>();
    object.reserve(members.size());
    for (auto& [k, v] : members) object.emplace_back(std::move(k), std::move(v));
    members_.pop_back();
    check_repeated(*open_.back());
    open_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    open_.push_back(add_container(json::array()));
    keys_.emplace_back();
    return true;
  }
  bool end_array() override {
    open_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }

 private:
  bool add(json&& value) {
    (void)add_container(std::move(value));
    return true;
  }
  /// Puts `value` where the parser is and returns where it now lives.
  json* add_container(json&& value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    auto& members = members_.back();
    members.emplace_back(keys_.back(), std::move(value));  // appended: no search
    return &members.back().second;
  }
  void check_repeated(const json& value) {
    if (!repeated_.empty() || !value.is_object() || value.size() < 2) return;
    const auto& object = *value.get_ptr<const json::object_t*>();
    std::vector<const std::string*> names;
    names.reserve(object.size());
    for (const auto& item : object) names.push_back(&item.first);
    std::sort(names.begin(), names.end(),
              [](const std::string* a, const std::string* b) { return *a < *b; });
    const auto twice =
        std::adjacent_find(names.begin(), names.end(),
                           [](const std::string* a, const std::string* b) { return *a == *b; });
    if (twice == names.end()) return;
    // The dotted path: the keys of the enclosing objects, then the repeated one.
    for (size_t level = 0; level + 1 < keys_.size(); ++level) {
      if (open_[level]->is_object()) repeated_ += keys_[level] + ".";
    }
    repeated_ += **twice;
  }

  json root_;
  std::vector<json*> open_;        // the containers being filled, outermost first
  std::vector<std::string> keys_;  // per open container: the key being read (objects)
  // Per open object, its members so far; a member that is itself open lives here until then.
  std::vector<std::vector<std::pair<std::string, json>>> members_;
  std::string repeated_;
  std::string error_;
};

}  // namespace

nlohmann::ordered_json parse_json_strictly(const std::string& text, const std::string& path,
                                           const std::string& what) {
  StrictBuilder builder;
  const bool ok = json::sax_parse(text, &builder);
  if (!ok) {
    throw malformed_file(path, what + " is not JSON: " + builder.error());
  }
  if (!builder.repeated().empty()) {
    throw malformed_file(path, what + " names '" + builder.repeated() + "' twice",
                         builder.repeated());
  }
  return std::move(builder.result());
}

}  // namespace wrapcert::detail
