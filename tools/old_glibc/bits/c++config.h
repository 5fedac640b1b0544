// libstdc++'s configuration (GCC's own, next on the include path), less the glibc functions
// newer than the glibc the wheels target (make wheels: 2.28). GCC's libstdc++ was configured on
// this machine's glibc (2.36), so its headers would call pthread_cond_clockwait and
// pthread_mutex_clocklock (glibc 2.30) inline; without these macros they use the
// pthread_cond_timedwait / pthread_mutex_timedlock of every glibc, converting steady_clock
// deadlines to system_clock as libstdc++ does on glibc < 2.30. (tools/zig_cc.sh puts this
// directory first; docs/install.md says why the wheels are built so.)
#include_next <bits/c++config.h>
#undef _GLIBCXX_USE_PTHREAD_COND_CLOCKWAIT
#undef _GLIBCXX_USE_PTHREAD_MUTEX_CLOCKLOCK
#undef _GLIBCXX_USE_PTHREAD_RWLOCK_CLOCKLOCK
