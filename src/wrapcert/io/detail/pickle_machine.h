#pragma once
/// The pickle machine behind `read_torch_save` and the `torch.distributed.checkpoint` reader: it
/// runs a pickle without executing anything. Classes it does not know become opaque objects
/// (their arguments and state kept), an error only where a tensor or a known shape is expected.
/// Internal to wrapcert::io.

#include <wrapcert/error.h>
#include <wrapcert/io/detail/input_file.h>
#include <wrapcert/io/detail/pickle.h>

#include <torch/types.h>

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace wrapcert::detail {

/// A value on the pickle machine's stack. Classes the reader does not know are not called: they
/// become opaque objects, an error only where a tensor is expected.
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
    kObject,
    kMark
  };
  Kind kind = Kind::kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;              // string, "module name" of a global, class of an object
  std::vector<Value*> items;  // tuple, list, set
  std::vector<std::pair<Value*, Value*>> dict;
  torch::Tensor tensor;    // on meta
  size_t storage = 0;      // the tensor's storage, an index into the reader's storages
  Value* state = nullptr;  // an object's state, as BUILD gave it (a module's `__dict__`)
  Value* args = nullptr;   // the arguments of the call that made an object (REDUCE, NEWOBJ)
  // A string's opcode in the pickle, [begin, end), and whether the memo handed it out again.
  size_t begin = 0;
  size_t end = 0;
  bool reused = false;
};
// Values live in the reader's arena and point at each other without owning: a pickle may build
// a list that contains itself, or nest a million tuples, and neither leaks nor recurses.
using Ptr = Value*;

inline const std::map<std::string, c10::ScalarType>& storage_types() {
  static const std::map<std::string, c10::ScalarType> table = {
      {"torch FloatStorage", c10::kFloat},
      {"torch DoubleStorage", c10::kDouble},
      {"torch HalfStorage", c10::kHalf},
      {"torch BFloat16Storage", c10::kBFloat16},
      {"torch LongStorage", c10::kLong},
      {"torch IntStorage", c10::kInt},
      {"torch ShortStorage", c10::kShort},
      {"torch CharStorage", c10::kChar},
      {"torch ByteStorage", c10::kByte},
      {"torch BoolStorage", c10::kBool},
      {"torch ComplexFloatStorage", c10::kComplexFloat},
      {"torch ComplexDoubleStorage", c10::kComplexDouble}};
  return table;
}

/// Runs one pickle from `data[pos]` to its STOP. Storages become meta tensors recorded in
/// `storages` (shared across the pickles of one file).
class Reader {
 public:
  Reader(std::string path, const char* data, size_t size, size_t pos,
         std::vector<detail::PickledStorage>& storages)
      : path_(std::move(path)), data_(data), size_(size), pos_(pos), storages_(storages) {}

  size_t pos() const { return pos_; }
  /// Every class or function the pickle names ("module name"), whether called or not.
  const std::set<std::string>& globals() const { return globals_; }
  /// Where each FRAME opcode starts (9 bytes: the opcode and a length).
  const std::vector<size_t>& frames() const { return frames_; }
  /// While the pickle runs, the error names the byte of the opcode that failed.
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw detail::malformed_file(
        path_, running_ ? what + " (the opcode at byte " + std::to_string(op_begin_) + ")" : what,
        key);
  }

  Ptr run() {
    running_ = true;
    while (true) {
      op_begin_ = pos_;
      const auto op = static_cast<unsigned char>(byte());
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO
        case 0x95:
          frames_.push_back(pos_ - 1);
          bytes(8);
          break;  // FRAME
        case 0x94:
          memoize(memo_count_, top());
          break;  // MEMOIZE
        case '.':
          running_ = false;
          return pop();  // STOP
        case '(':
          push(shared(Value::Kind::kMark, 0));
          break;
        case '0':
          pop();
          break;  // POP
        case '1':
          pop_to_mark();
          break;  // POP_MARK
        case '2':
          push(top());
          break;  // DUP
        case 'N':
          push(shared(Value::Kind::kNone, 0));
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
          push_long(static_cast<unsigned char>(byte()));
          break;
        case 0x8b:
          push_long(uint_le(4));
          break;
        case 'G':
          push_float();
          break;
        case 'X':  // BINUNICODE
        case 'T':  // BINSTRING
        case 'B':  // BINBYTES
          push_string(uint_le(4));
          break;
        case 0x8c:  // SHORT_BINUNICODE
        case 'U':   // SHORT_BINSTRING
        case 'C':   // SHORT_BINBYTES
          push_string(static_cast<unsigned char>(byte()));
          break;
        case 0x8d:  // BINUNICODE8
        case 0x8e:  // BINBYTES8
          push_string(uint_le(8));
          break;
        case 'c':
          push_global();
          break;
        case 0x93: {  // STACK_GLOBAL
          auto name = pop();
          auto module = pop();
          if (name->kind != Value::Kind::kString || module->kind != Value::Kind::kString) {
            fail("", "STACK_GLOBAL of something that is not two strings");
          }
          auto v = make(Value::Kind::kGlobal);
          v->s = module->s + " " + name->s;
          globals_.insert(v->s);
          push(v);
          break;
        }
        case 'q':
          memoize(static_cast<unsigned char>(byte()), top());
          break;
        case 'r':
          memoize(uint_le(4), top());
          break;
        case 'h':
          push(memo(static_cast<unsigned char>(byte())));
          break;
        case 'j':
          push(memo(uint_le(4)));
          break;
        case ')':  // EMPTY_TUPLE: one for all, as tuples never change
          if (!empty_tuple_) empty_tuple_ = make(Value::Kind::kTuple);
          push(empty_tuple_);
          break;
        case ']':
          push(make(Value::Kind::kList));
          break;
        case '}':
          push(make(Value::Kind::kDict));
          break;
        case 0x8f:  // EMPTY_SET
          push(make_object("builtins set"));
          break;
        case 0x90: {  // ADDITEMS
          auto items = pop_to_mark();
          auto* set = growable("ADDITEMS");
          for (auto& v : items) set->items.push_back(v);
          break;
        }
        case 0x91: {  // FROZENSET
          auto set = make_object("builtins frozenset");
          set->items = pop_to_mark();
          push(set);
          break;
        }
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
          growable("APPEND")->items.push_back(v);
          break;
        }
        case 'e': {
          auto items = pop_to_mark();
          auto* list = growable("APPENDS");
          for (auto& v : items) list->items.push_back(v);
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
        case 'b': {  // BUILD: an object's state, kept to name what the object is
          auto state = pop();
          if (top()->kind == Value::Kind::kObject) top()->state = state;
          break;
        }
        case 'R': {
          auto args = pop();
          auto fn = pop();
          push(reduce(fn, args));
          break;
        }
        case 0x81: {  // NEWOBJ
          auto args = pop();
          auto cls = pop();
          push(make_object(cls->kind == Value::Kind::kGlobal ? cls->s : "?"));
          top()->args = args;
          break;
        }
        case 0x92: {  // NEWOBJ_EX
          pop();
          pop();
          auto cls = pop();
          push(make_object(cls->kind == Value::Kind::kGlobal ? cls->s : "?"));
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
  static std::string hex(unsigned v) {
    const char* digits = "0123456789abcdef";
    return std::string{digits[v >> 4], digits[v & 15]};
  }
  char byte() {
    if (pos_ >= size_) fail("", "the pickle ends early");
    return data_[pos_++];
  }
  std::string bytes(uint64_t n) {
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
  /// Python's pickler numbers its memo 0, 1, 2, ...: those go in a vector; any other number
  /// (a hand-made pickle) in a map, so that a huge number costs no memory.
  void memoize(uint64_t i, Ptr v) {
    bool fresh = true;
    if (i == memo_.size()) {
      memo_.push_back(v);
    } else if (i < memo_.size()) {
      fresh = memo_[i] == nullptr;
      memo_[i] = v;
    } else {
      auto [it, inserted] = sparse_memo_.try_emplace(i, v);
      it->second = v;
      fresh = inserted;
    }
    if (fresh) ++memo_count_;
  }
  Ptr memo(uint64_t i) {
    Ptr v = nullptr;
    if (i < memo_.size()) {
      v = memo_[i];
    } else if (auto it = sparse_memo_.find(i); it != sparse_memo_.end()) {
      v = it->second;
    }
    if (!v) fail("", "the pickle refers to an unknown memo entry");
    v->reused = true;
    return v;
  }
  /// The top of the stack, for APPEND(S) and ADDITEMS: a list, or an object (a set, a class
  /// of the pickle's own); never a shared scalar or tuple.
  Ptr growable(const char* op) {
    auto* v = top();
    if (v->kind != Value::Kind::kList && v->kind != Value::Kind::kObject) {
      fail("", std::string(op) + " to something that is neither a list nor an object");
    }
    return v;
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
    if (arena_.empty() || used_ == kBlock) {
      arena_.push_back(std::make_unique<Value[]>(kBlock));
      used_ = 0;
    }
    Value* v = &arena_.back()[used_++];
    v->kind = kind;
    return v;
  }
  Ptr make_object(const std::string& cls) {
    auto v = make(Value::Kind::kObject);
    v->s = cls;
    return v;
  }
  Ptr tuple(std::vector<Ptr> items) {
    auto t = make(Value::Kind::kTuple);
    t->items = std::move(items);
    return t;
  }
  /// None, a mark, a bool or a small int: one value each, shared by every use (nothing changes
  /// a value once made), so that a pickle of a million small numbers (DCP's sizes and offsets)
  /// does not make a million values.
  Ptr shared(Value::Kind kind, int64_t i) {
    constexpr auto kSmall = static_cast<int64_t>(std::tuple_size_v<decltype(small_ints_)>);
    Ptr* slot = kind == Value::Kind::kNone   ? &none_
                : kind == Value::Kind::kMark ? &mark_
                : kind == Value::Kind::kBool ? &bools_[i != 0]
                : (i >= 0 && i < kSmall)     ? &small_ints_[static_cast<size_t>(i)]
                                             : nullptr;
    if (slot && *slot) return *slot;
    auto v = make(kind);
    v->i = i;
    if (slot) *slot = v;
    return v;
  }
  void push_bool(bool b) { push(shared(Value::Kind::kBool, b)); }
  void push_int(int64_t i) { push(shared(Value::Kind::kInt, i)); }
  void push_long(uint64_t n) {
    const auto b = bytes(n);
    if (n > 8) {  // not a size or an offset: kept as an opaque number
      push(make_object("builtins int"));
      return;
    }
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
    v->begin = op_begin_;
    v->s = bytes(n);
    v->end = pos_;
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
    globals_.insert(v->s);
    push(v);
  }
  void set_item(const Ptr& dict, const Ptr& key, const Ptr& value) {
    if (dict->kind != Value::Kind::kDict) fail("", "SETITEM on something that is not a dict");
    dict->dict.emplace_back(key, value);
  }

  Ptr reduce(const Ptr& fn, const Ptr& args) {
    if (fn->kind != Value::Kind::kGlobal) fail("", "REDUCE of something that is not a class");
    if (fn->s == "collections OrderedDict") return make(Value::Kind::kDict);
    if (fn->s == "torch.jit._pickle restore_type_tag") {  // what LibTorch's pickler writes
      if (args->kind != Value::Kind::kTuple || args->items.empty()) fail("", "a malformed tag");
      return args->items[0];
    }
    if (fn->s == "torch._utils _rebuild_parameter") {
      if (args->kind != Value::Kind::kTuple || args->items.empty() ||
          args->items[0]->kind != Value::Kind::kTensor) {
        fail("", "a malformed parameter");
      }
      return args->items[0];
    }
    if (fn->s == "torch._utils _rebuild_tensor_v2") return rebuild_tensor(args);
    const bool tuple = args->kind == Value::Kind::kTuple;
    if ((fn->s == "torch._tensor _rebuild_from_type_v2" ||
         fn->s == "torch._tensor _rebuild_from_type") &&
        tuple && args->items.size() >= 3 && args->items[1]->kind == Value::Kind::kGlobal) {
      // A tensor subclass: (function, class, its arguments, state). A subclass over plain data
      // is its tensor; another (a ShardedTensor, a DTensor) is named by its class.
      const auto& cls = args->items[1]->s;
      const bool sharded = cls.find("ShardedTensor") != std::string::npos ||
                           cls.find(" DTensor") != std::string::npos;
      if (!sharded && args->items[0]->kind == Value::Kind::kGlobal &&
          args->items[0]->s == "torch._utils _rebuild_tensor_v2") {
        return rebuild_tensor(args->items[2]);
      }
      return make_object(cls);
    }
    if (fn->s == "copyreg _reconstructor" && tuple && !args->items.empty() &&
        args->items[0]->kind == Value::Kind::kGlobal) {
      return make_object(args->items[0]->s);  // protocols 0 and 1: the object's class
    }
    // Anything else (an optimizer's hyper-parameters in a class, a set, a quantized tensor) is
    // kept unexecuted, with its arguments; it is an error only where a tensor is needed.
    auto object = make_object(fn->s);
    object->args = args;
    return object;
  }

  Ptr rebuild_tensor(const Ptr& args) {
    if (args->kind != Value::Kind::kTuple) fail("", "REDUCE arguments that are not a tuple");
    const auto& a = args->items;
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
    v->storage = a[0]->storage;
    return v;
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
    if (type == storage_types().end()) {
      throw Error(ErrorCode::kUnsupported, "",
                  path_ + ": a storage of type '" + p[1]->s + "', which wrapcert does not read");
    }
    const auto& key = p[2]->s;
    if (auto it = by_key_.find(key); it != by_key_.end()) return it->second;
    const int64_t numel = non_negative(p[4], "a storage size");
    int64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(type->second)),
                               &bytes)) {
      fail("", "storage " + key + " has a size that overflows");
    }
    auto v = make(Value::Kind::kTensor);
    v->tensor =
        torch::empty({numel}, torch::TensorOptions().dtype(type->second).device(c10::kMeta));
    v->storage = storages_.size();
    for (const auto& s : storages_) {
      if (s.key == key) fail("", "storage " + key + " is named twice");
    }
    storages_.push_back({key, type->second, numel});
    by_key_.emplace(key, v);
    return v;
  }

  std::string path_;
  // Values in blocks: stable addresses, one allocation per block of values.
  static constexpr size_t kBlock = 1024;
  std::vector<std::unique_ptr<Value[]>> arena_;
  size_t used_ = 0;  // in the last block
  Ptr none_ = nullptr;
  Ptr mark_ = nullptr;
  Ptr bools_[2] = {nullptr, nullptr};
  std::array<Ptr, 1024> small_ints_{};
  std::set<std::string> globals_;
  const char* data_;
  size_t size_;
  size_t pos_;
  size_t op_begin_ = 0;
  bool running_ = false;
  std::vector<size_t> frames_;
  std::vector<Ptr> stack_;
  std::vector<Ptr> memo_;
  std::unordered_map<uint64_t, Ptr> sparse_memo_;
  uint64_t memo_count_ = 0;  // entries in the memo: MEMOIZE's next number, as Python counts
  Ptr empty_tuple_ = nullptr;
  std::unordered_map<std::string, Ptr> by_key_;
  std::vector<detail::PickledStorage>& storages_;
};

}  // namespace wrapcert::detail
