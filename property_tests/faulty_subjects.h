#pragma once
/// Deliberately wrong unwrap subjects: each property must be shown to reject at least one.
///
///   auto v = wrapcert::props::exact_keys(spec, wrapcert::faulty::reorders_keys());
///   // v.passed == false for a spec with two or more keys out of alphabetical order

#include <wrapcert/certify/properties.h>

namespace wrapcert::faulty {

props::UnwrapSubject skips_wrappers_in_containers();  ///< leaves Sequential/List/Dict elements
props::UnwrapSubject copies_tensors();                ///< clones instead of aliasing
props::UnwrapSubject unties_weights();                ///< a shared tensor saved as two copies
props::UnwrapSubject stops_after_two_levels();        ///< unwraps at most two wrappers per path
props::UnwrapSubject mutates_input();                 ///< right keys, but rewires the live model
props::UnwrapSubject reorders_keys();                 ///< right keys, sorted alphabetically
props::UnwrapSubject drops_flat_restoration();        ///< releases flat parameters as zeros
/// Rewrites keys by substring, `str.replace(slot + ".", "")` for every slot name.
props::Translator substring_translator();

}  // namespace wrapcert::faulty
