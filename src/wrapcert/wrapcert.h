#pragma once
/// Everything in `wrapcert::core`, for users who prefer one include.
///
///   #include <wrapcert/wrapcert.h>
///   auto view = wrapcert::unwrap_reference(wrapped_model);
///   std::cout << view;

#include <wrapcert/distributed.h>
#include <wrapcert/error.h>
#include <wrapcert/flat_parameters.h>
#include <wrapcert/keys.h>
#include <wrapcert/layer.h>
#include <wrapcert/plugin.h>
#include <wrapcert/printer.h>
#include <wrapcert/process_group.h>
#include <wrapcert/recipes.h>
#include <wrapcert/registry.h>
#include <wrapcert/release_tree.h>
#include <wrapcert/sharding.h>
#include <wrapcert/state_dict.h>
#include <wrapcert/unwrap.h>
#include <wrapcert/view.h>
#include <wrapcert/wrap.h>
#include <wrapcert/wrappers.h>
