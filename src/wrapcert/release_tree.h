#pragma once
/// Dropping very deep module trees.

#include <wrapcert/registry.h>

namespace wrapcert {

/// Drops `root` (the caller's last reference) without the recursion of LibTorch's destructors,
/// which take one stack frame chain per level and overflow somewhere past 10^4 levels. Shared
/// modules still referenced elsewhere survive; nothing in the tree is modified.
///
///   wrapcert::release_tree(std::move(hundred_thousand_deep_chain));
void release_tree(ModulePtr root);

}  // namespace wrapcert
