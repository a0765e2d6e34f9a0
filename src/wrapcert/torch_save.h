#pragma once
/// Reading the state dicts people save with `torch.save(model.state_dict())`: the zip archive
/// (through LibTorch's own `PyTorchStreamReader`) and the subset of the pickle protocol that
/// state dicts use, including the `OrderedDict` with `_metadata` that LibTorch 1.13's
/// `torch::pickle_load` rejects.
///
///   auto state = wrapcert::load_torch_save("model.pt");   // key -> tensor, in saved order

#include <wrapcert/view.h>

#include <string>

namespace wrapcert {

/// Every tensor of a saved state dict (or plain dict of tensors), on the CPU, in saved order.
/// Tensors that shared a storage in Python share it here. Throws `Error` (kMalformedInput)
/// naming the file, and the key where there is one, for a damaged archive, an unsupported
/// pickle construct, or a value that is not a tensor.
StateDict load_torch_save(const std::string& path);

}  // namespace wrapcert
