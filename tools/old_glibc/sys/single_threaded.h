// glibc 2.32's <sys/single_threaded.h>, for a glibc 2.28 target. libstdc++ 12 (its headers, and
// its static library, compiled on glibc 2.36) reads __libc_single_threaded to skip atomic
// reference counts in a process without threads. glibc 2.28 has no such variable:
// single_threaded.c defines it inside the extension, as 0 (never single-threaded), so the counts
// are always atomic, which is what libstdc++ does on a glibc without it once a thread exists.
#pragma once
extern char __libc_single_threaded;
