// The translation unit that owns wrapcert's precompiled LibTorch headers
// (cmake/WrapcertCompilerSetup.cmake); the targets that reuse them compile nothing of it.
