#include <wrapcert/detail/pickle.h>
#include <wrapcert/error.h>
#include <wrapcert/torch_save.h>

#include <caffe2/serialize/inline_container.h>
#include <torch/types.h>

#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

namespace wrapcert {
namespace {

/// A value on the pickle machine's stack: only what state dicts contain.
struct Value {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kTensor,
    kMark
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;              // string, or "module name" of a global
  std::vector<Value*> items;  // tuple, list
  std::vector<std::pair<Value*, Value*>> dict;
  torch::Tensor tensor;
};
// Values live in the reader's arena and point at each other without owning: a pickle may build
// a list that contains itself, or nest a million tuples, and neither leaks nor recurses.
using Ptr = Value*;

const std::map<std::string, c10::ScalarType>& storage_types() {
  static const std::map<std::string, c10::ScalarType> table = {
      {"torch FloatStorage", c10::kFloat}, {"torch DoubleStorage", c10::kDouble},
      {"torch HalfStorage", c10::kHalf},   {"torch BFloat16Storage", c10::kBFloat16},
      {"torch LongStorage", c10::kLong},   {"torch IntStorage", c10::kInt},
      {"torch ShortStorage", c10::kShort}, {"torch CharStorage", c10::kChar},
      {"torch ByteStorage", c10::kByte},   {"torch BoolStorage", c10::kBool}};
  return table;
}

class Reader {
 public:
  Reader(std::string path, const detail::RecordSource& records, const char* data, size_t size)
      : path_(std::move(path)), records_(records), data_(data), size_(size) {}

  Ptr run() {
    while (true) {
      const auto op = static_cast<unsigned char>(byte());
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO
        case 0x95:
          bytes(8);
          break;  // FRAME
        case 0x94:
          memo_[memo_.size()] = top();
          break;  // MEMOIZE
        case '.':
          return pop();  // STOP
        case '(':
          push(make(Value::Kind::kMark));
          break;
        case 'N':
          push(make(Value::Kind::kNone));
          break;
        case 0x88:
          push_bool(true);
          break;
        case 0x89:
          push_bool(false);
          break;
        case 'K':
          push_int(static_cast<unsigned char>(byte()));
          break;
        case 'M':
          push_int(static_cast<int64_t>(uint_le(2)));
          break;
        case 'J':
          push_int(static_cast<int32_t>(uint_le(4)));
          break;
        case 0x8a:
          push_long1();
          break;
        case 'G':
          push_float();
          break;
        case 'X':
          push_string(uint_le(4));
          break;
        case 0x8c:
          push_string(static_cast<unsigned char>(byte()));
          break;
        case 'c':
          push_global();
          break;
        case 'q':
          memo_[static_cast<unsigned char>(byte())] = top();
          break;
        case 'r':
          memo_[uint_le(4)] = top();
          break;
        case 'h':
          push(memo(static_cast<unsigned char>(byte())));
          break;
        case 'j':
          push(memo(uint_le(4)));
          break;
        case ')':
          push(make(Value::Kind::kTuple));
          break;
        case ']':
          push(make(Value::Kind::kList));
          break;
        case '}':
          push(make(Value::Kind::kDict));
          break;
        case 't':
          push(tuple(pop_to_mark()));
          break;
        case 0x85:
        case 0x86:
        case 0x87: {
          std::vector<Ptr> items(static_cast<size_t>(op - 0x84));
          for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
          push(tuple(std::move(items)));
          break;
        }
        case 'a': {
          auto v = pop();
          top()->items.push_back(v);
          break;
        }
        case 'e': {
          auto items = pop_to_mark();
          for (auto& v : items) top()->items.push_back(v);
          break;
        }
        case 's': {
          auto v = pop();
          auto k = pop();
          set_item(top(), k, v);
          break;
        }
        case 'u': {
          auto items = pop_to_mark();
          if (items.size() % 2) fail("", "SETITEMS with an odd number of values");
          for (size_t i = 0; i < items.size(); i += 2) set_item(top(), items[i], items[i + 1]);
          break;
        }
        case 'b':
          pop();
          break;  // BUILD: an OrderedDict's attributes (`_metadata`); not needed
        case 'R': {
          auto args = pop();
          auto fn = pop();
          push(reduce(fn, args));
          break;
        }
        case 'Q':
          push(persistent(pop()));
          break;
        default:
          fail("",
               "unsupported pickle opcode 0x" + hex(op) + " at byte " + std::to_string(pos_ - 1));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(ErrorCode::kMalformedInput, key, path_ + ": " + what);
  }
  static std::string hex(unsigned v) {
    const char* digits = "0123456789abcdef";
    return std::string{digits[v >> 4], digits[v & 15]};
  }
  char byte() {
    if (pos_ >= size_) fail("", "the pickle ends early");
    return data_[pos_++];
  }
  std::string bytes(size_t n) {
    if (n > size_ - pos_) fail("", "the pickle ends early");
    std::string out(data_ + pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t uint_le(size_t n) {
    const auto b = bytes(n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(b[i]);
    return v;
  }
  void push(Ptr v) { stack_.push_back(v); }
  Ptr pop() {
    if (stack_.empty()) fail("", "the pickle pops an empty stack");
    auto* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Ptr top() {
    if (stack_.empty()) fail("", "the pickle reads an empty stack");
    return stack_.back();
  }
  Ptr memo(uint64_t i) {
    auto it = memo_.find(i);
    if (it == memo_.end()) fail("", "the pickle refers to an unknown memo entry");
    return it->second;
  }
  std::vector<Ptr> pop_to_mark() {
    std::vector<Ptr> items;
    while (true) {
      auto v = pop();
      if (v->kind == Value::Kind::kMark) break;
      items.push_back(v);
    }
    return {items.rbegin(), items.rend()};
  }
  Ptr make(Value::Kind kind) {
    arena_.push_back(std::make_unique<Value>());
    arena_.back()->kind = kind;
    return arena_.back().get();
  }
  Ptr tuple(std::vector<Ptr> items) {
    auto t = make(Value::Kind::kTuple);
    t->items = std::move(items);
    return t;
  }
  void push_bool(bool b) {
    auto v = make(Value::Kind::kBool);
    v->i = b;
    push(v);
  }
  void push_int(int64_t i) {
    auto v = make(Value::Kind::kInt);
    v->i = i;
    push(v);
  }
  void push_long1() {
    const auto n = static_cast<unsigned char>(byte());
    if (n > 8) fail("", "an integer too large for a state dict");
    const auto b = bytes(n);
    int64_t v = 0;
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(b[i]);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(b[n - 1]) & 0x80)) v -= int64_t{1} << (8 * n);
    push_int(v);
  }
  void push_float() {
    auto b = bytes(8);  // big-endian IEEE 754
    uint64_t bits = 0;
    for (unsigned char c : b) bits = (bits << 8) | c;
    auto v = make(Value::Kind::kFloat);
    std::memcpy(&v->f, &bits, sizeof(double));
    push(v);
  }
  void push_string(uint64_t n) {
    auto v = make(Value::Kind::kString);
    v->s = bytes(n);
    push(v);
  }
  void push_global() {
    auto line = [this] {
      std::string out;
      for (char c = byte(); c != '\n'; c = byte()) out += c;
      return out;
    };
    auto v = make(Value::Kind::kGlobal);
    v->s = line();
    v->s += " " + line();
    push(v);
  }
  void set_item(const Ptr& dict, const Ptr& key, const Ptr& value) {
    if (dict->kind != Value::Kind::kDict) fail("", "SETITEM on something that is not a dict");
    dict->dict.emplace_back(key, value);
  }

  Ptr reduce(const Ptr& fn, const Ptr& args) {
    if (fn->kind != Value::Kind::kGlobal) fail("", "REDUCE of something that is not a class");
    if (fn->s == "collections OrderedDict") return make(Value::Kind::kDict);
    if (fn->s == "torch._utils _rebuild_tensor_v2" || fn->s == "torch._utils _rebuild_parameter") {
      if (args->kind != Value::Kind::kTuple) fail("", "REDUCE arguments that are not a tuple");
      const auto& a = args->items;
      if (fn->s == "torch._utils _rebuild_parameter") {
        if (a.empty() || a[0]->kind != Value::Kind::kTensor) fail("", "a malformed parameter");
        return a[0];
      }
      if (a.size() < 4 || a[0]->kind != Value::Kind::kTensor || a[1]->kind != Value::Kind::kInt ||
          a[2]->kind != Value::Kind::kTuple || a[3]->kind != Value::Kind::kTuple ||
          a[2]->items.size() != a[3]->items.size()) {
        fail("", "a malformed tensor (storage, offset, size and stride of one length expected)");
      }
      std::vector<int64_t> size, stride;
      for (const auto* d : a[2]->items) size.push_back(non_negative(d, "a size"));
      for (const auto* d : a[3]->items) stride.push_back(non_negative(d, "a stride"));
      const int64_t offset = non_negative(a[1], "a storage offset");
      const auto& storage = a[0]->tensor;
      // The last element the view reaches must lie inside the storage.
      bool empty = false;
      int64_t last = offset;
      for (size_t d = 0; d < size.size(); ++d) {
        empty = empty || size[d] == 0;
        int64_t step = 0;
        if (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &step) ||
                            __builtin_add_overflow(last, step, &last))) {
          fail("", "a tensor whose extent overflows");
        }
      }
      if (!empty && last >= storage.numel()) fail("", "a tensor reaches past its storage");
      auto v = make(Value::Kind::kTensor);
      v->tensor = storage.as_strided(size, stride, offset);
      return v;
    }
    fail("", "unsupported class '" + fn->s + "' in a state dict file");
  }

  int64_t non_negative(const Value* v, const char* what) {
    if (v->kind != Value::Kind::kInt || v->i < 0) {
      fail("", std::string(what) + " that is not a non-negative integer");
    }
    return v->i;
  }

  Ptr persistent(const Ptr& pid) {
    const auto& p = pid->items;
    if (pid->kind != Value::Kind::kTuple || p.size() < 5 || p[0]->kind != Value::Kind::kString ||
        p[0]->s != "storage" || p[1]->kind != Value::Kind::kGlobal ||
        p[2]->kind != Value::Kind::kString) {
      fail("", "an unsupported persistent id");
    }
    const auto type = storage_types().find(p[1]->s);
    if (type == storage_types().end()) fail("", "unsupported storage type '" + p[1]->s + "'");
    const auto& key = p[2]->s;
    if (auto it = storages_.find(key); it != storages_.end()) return it->second;
    const int64_t numel = non_negative(p[4], "a storage size");
    const auto record = "data/" + key;
    auto found = records_(record);
    if (!found) fail("", "the archive lacks storage " + record);
    auto& [ptr, bytes] = *found;
    const size_t element = c10::elementSize(type->second);
    if (static_cast<uint64_t>(numel) > bytes / element || bytes != numel * element) {
      fail("", "storage " + record + " holds " + std::to_string(bytes) + " bytes, not " +
                   std::to_string(numel) + " elements of " + std::to_string(element));
    }
    auto v = make(Value::Kind::kTensor);
    v->tensor = torch::empty({numel}, torch::TensorOptions().dtype(type->second));
    if (bytes) std::memcpy(v->tensor.data_ptr(), ptr.get(), bytes);
    storages_.emplace(key, v);
    return v;
  }

  std::string path_;
  const detail::RecordSource& records_;
  std::vector<std::unique_ptr<Value>> arena_;
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  std::vector<Ptr> stack_;
  std::unordered_map<uint64_t, Ptr> memo_;
  std::unordered_map<std::string, Ptr> storages_;
};

}  // namespace

namespace detail {

StateDict read_state_dict_pickle(const char* data, size_t size, const RecordSource& records,
                                 const std::string& path) {
  Reader reader(path, records, data, size);
  const auto root = reader.run();
  if (root->kind != Value::Kind::kDict) {
    throw Error(ErrorCode::kMalformedInput, "", path + ": the file does not hold a dict");
  }
  StateDict state;
  for (const auto& [k, v] : root->dict) {
    if (k->kind != Value::Kind::kString) {
      throw Error(ErrorCode::kMalformedInput, "", path + ": a key that is not a string");
    }
    if (v->kind != Value::Kind::kTensor) {
      throw Error(ErrorCode::kMalformedInput, k->s, path + ": the value is not a tensor");
    }
    if (state.contains(k->s)) {
      throw Error(ErrorCode::kMalformedInput, k->s, path + ": the key is saved twice");
    }
    state.insert(k->s, v->tensor);
  }
  return state;
}

}  // namespace detail

StateDict load_torch_save(const std::string& path) {
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  at::DataPtr pickle;
  size_t size = 0;
  try {
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    std::tie(pickle, size) = archive->getRecord("data.pkl");
  } catch (const c10::Error& e) {
    const std::string what = e.what();
    throw Error(ErrorCode::kMalformedInput, "",
                path + ": not a torch.save zip archive (" + what.substr(0, what.find('\n')) + ")");
  }
  const detail::RecordSource records =
      [&archive, &path](const std::string& name) -> std::optional<std::pair<at::DataPtr, size_t>> {
    try {
      if (!archive->hasRecord(name)) return std::nullopt;
      auto [bytes, size] = archive->getRecord(name);
      return std::make_pair(std::move(bytes), size);
    } catch (const c10::Error& e) {
      const std::string what = e.what();
      throw Error(
          ErrorCode::kMalformedInput, "",
          path + ": record " + name + " is damaged (" + what.substr(0, what.find('\n')) + ")");
    }
  };
  return detail::read_state_dict_pickle(static_cast<const char*>(pickle.get()), size, records,
                                        path);
}

}  // namespace wrapcert
