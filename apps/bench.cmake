# The benchmark program (issue 5): plain blocking sockets, so the same binary
# measures kernel TCP, rsockets' preload and libsovia's preload. The harness
# that drives it lives in bench/.
add_executable(sovia-bench ${CMAKE_CURRENT_LIST_DIR}/sovia_bench.c)
