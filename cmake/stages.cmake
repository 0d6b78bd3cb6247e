# One static library per pipeline stage, each linking only the stages below it, and each
# compiled against an include root that holds only its own folder and theirs: an #include
# that runs up a floor (say gpu/ including serve/learner.h) is a compile error, not a habit.
#
#   common < config < model_store < ingest          (bytes -> events)
#   common < model_store < gpu_cuda < gpu          (the engine interface and its engines)
#   common < model_store < snapshots               (LMDB writer and loader)
#   common < ops                                   (metrics, HTTP)
#   all of them < serve                            (the service floor that wires them)
#
# cmd/, tests/ and bench/ sit above every stage and see the whole tree.

set(MFS_STAGE_INCLUDE ${PROJECT_BINARY_DIR}/stage-include)
configure_file(${PROJECT_SOURCE_DIR}/cmake/version.h.in ${PROJECT_BINARY_DIR}/generated/mfs_version.h @ONLY)

# mfs_stage(NAME name FOLDERS folders... SOURCES files... LINK targets...)
# FOLDERS: the source folders the stage may include from (its own first).
function(mfs_stage)
  cmake_parse_arguments(S "" "NAME" "FOLDERS;SOURCES;LINK" ${ARGN})
  set(root ${MFS_STAGE_INCLUDE}/${S_NAME})
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root})
  foreach(dir ${S_FOLDERS})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${dir} ${root}/${dir} SYMBOLIC)
  endforeach()
  add_library(mfs_${S_NAME} STATIC ${S_SOURCES})
  target_include_directories(mfs_${S_NAME} PRIVATE ${root} ${PROJECT_BINARY_DIR}/generated)
  target_link_libraries(mfs_${S_NAME} PUBLIC ${S_LINK})
  if(NOT S_NAME STREQUAL "gpu_cuda")
    target_compile_options(mfs_${S_NAME} PRIVATE ${MFS_WARNINGS})
    if(OpenMP_C_FOUND)
      # Only the SIMD pragmas: threads are ours (pthreads), so no OpenMP runtime is needed.
      target_compile_options(mfs_${S_NAME} PRIVATE $<$<COMPILE_LANGUAGE:C>:-fopenmp-simd>)
    endif()
  endif()
endfunction()

mfs_stage(NAME common FOLDERS common
  SOURCES common/err.c common/fault.c common/keycount.c common/log.c common/offsets.c common/par.c
  LINK Threads::Threads m)
mfs_stage(NAME config FOLDERS config common
  SOURCES config/config.c
  LINK mfs_common PkgConfig::INIH)
mfs_stage(NAME model_store FOLDERS model_store common
  SOURCES model_store/admit.c model_store/id.c model_store/idmap.c model_store/life.c model_store/model.c model_store/touched.c
  LINK mfs_common PkgConfig::XXHASH)
mfs_stage(NAME ingest FOLDERS ingest model_store config common
  SOURCES ingest/dataset.c ingest/event.c ingest/event_source.c ingest/kafka_consumer.c
    ingest/kafka_util.c ingest/producer.c ingest/ratings_file.c ingest/ratings_writer.c ingest/synth.c
  LINK mfs_config mfs_model_store PkgConfig::RDKAFKA PkgConfig::MSGPACK PkgConfig::XXHASH
    PkgConfig::ZSTD PkgConfig::ZLIB)
set(MFS_GPU_LINK mfs_model_store mfs_common)
if(MFS_HAVE_CUDA)
  file(GLOB MFS_CUDA_SRC CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/gpu/cuda/*.cu)
  # gpu_cuda implements the engine interface (gpu/engine_int.h, a header of the floor above
  # it): it sees gpu/ for that header; gpu links it, never the other way round.
  mfs_stage(NAME gpu_cuda FOLDERS gpu model_store common
    SOURCES ${MFS_CUDA_SRC}
    LINK mfs_model_store mfs_common CUDA::cudart_static)
  set_target_properties(mfs_gpu_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  list(PREPEND MFS_GPU_LINK mfs_gpu_cuda)
endif()
mfs_stage(NAME gpu FOLDERS gpu model_store common
  SOURCES gpu/engine.c gpu/lr.c gpu/cpu/engine_cpu.c gpu/cpu/loss_ref.c gpu/cpu/sgd_ref.c
    gpu/cpu/merge_ref.c gpu/cpu/shard_ref.c gpu/sharded.c
  LINK ${MFS_GPU_LINK})
if(MFS_HAVE_CUDA)
  target_compile_definitions(mfs_gpu PUBLIC MFS_HAVE_CUDA=1)
  target_compile_definitions(mfs_gpu_cuda PRIVATE MFS_HAVE_CUDA=1)
endif()
mfs_stage(NAME snapshots FOLDERS snapshots model_store common
  SOURCES snapshots/snap_load.c snapshots/snap_rated.c snapshots/snap_size.c snapshots/snap_writer.c
  LINK mfs_model_store mfs_common PkgConfig::LMDB)
set(MFS_OPS_LINK mfs_common)
if(MFS_HAVE_MHD)
  list(APPEND MFS_OPS_LINK PkgConfig::MHD)
endif()
mfs_stage(NAME ops FOLDERS ops common
  SOURCES ops/catalog.c ops/http.c ops/metrics.c
  LINK ${MFS_OPS_LINK})
if(MFS_HAVE_MHD)
  target_compile_definitions(mfs_ops PUBLIC MFS_HAVE_MHD=1)
endif()
mfs_stage(NAME serve FOLDERS serve snapshots gpu ingest model_store config ops common
  SOURCES serve/batcher.c serve/consumer.c serve/exchange.c serve/latency.c serve/learner.c serve/meta.c
    serve/prequential.c serve/replay.c serve/publisher.c serve/rows.c serve/serve.c serve/stage_conf.c serve/window.c
  LINK mfs_snapshots mfs_gpu mfs_ingest mfs_ops mfs_config mfs_model_store mfs_common)

# What sits above every stage (cmd/, tests/, bench/): the whole tree and every stage.
add_library(mfs_all INTERFACE)
target_include_directories(mfs_all INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/generated)
target_link_libraries(mfs_all INTERFACE mfs_serve)
