#pragma once
/// What this process holds, for the memory tests and the benchmarks' counters.

namespace wrapcert::test_support {

/// Peak resident set size of this process in MiB (`VmHWM` in /proc/self/status); -1 where
/// there is no such file.
double peak_rss_mib();

}  // namespace wrapcert::test_support
