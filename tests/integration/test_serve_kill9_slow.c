/* test_serve_kill9_slow.c - the kill -9 proof with 20 rounds (ctest label slow). */
#define ROUNDS 20
#include "test_serve_kill9.c"
