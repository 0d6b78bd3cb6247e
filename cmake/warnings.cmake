# Warnings in the spirit of cmake-init: loud, but no -Werror unless asked.
set(MFS_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wformat=2 -Wcast-qual -Wundef
    -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter)
if(MFS_WERROR)
  list(APPEND MFS_WARNINGS -Werror)
endif()
