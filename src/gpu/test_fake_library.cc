// Shared libraries for dynlib's tests (not a test itself): built as modules, copied by the tests
// under the names of the libraries they stand for. STOKER_FAKE_API decides whether this copy has
// the API the search asks for.
#ifdef STOKER_FAKE_API
extern "C" __attribute__((visibility("default"))) int stoker_fake_api() { return 1; }
#else
extern "C" __attribute__((visibility("default"))) int stoker_fake_other() { return 2; }
#endif
