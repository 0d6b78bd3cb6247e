/* stage_conf.h - each stage's own configuration struct, built from the one configuration table.
 *
 * The stages below serve/ never read config/: the engine takes an mfs_engine_conf_t and
 * mfs_hparams_t, the learning-rate controller an mfs_lr_conf_t, the model an mfs_model_conf_t.
 * These functions are the one place that maps table keys onto them (the service, `train`,
 * benchmarks and tests all use them), so a key means the same everywhere.
 */
#ifndef MFS_STAGE_CONF_H
#define MFS_STAGE_CONF_H

#include "config/config.h"
#include "gpu/engine.h"
#include "gpu/lr.h"
#include "model_store/store.h"

/** engine.*, model.seed, model.dtype; frequent_loss when serve.prequential scores every batch.
 *  @return 0, or MFS_ECONFIG with errstr (engine.devices is not a list of device ordinals or
 *  "all"). */
int mfs_engine_conf_from(const mfs_conf_t *c, mfs_engine_conf_t *out, char *errstr, size_t errstr_size);
/** sgd.* lambdas, rating.min/max as the clip range, and learning rate lr (the controller's
 *  current rate, or sgd.lr). */
void mfs_hparams_from(const mfs_conf_t *c, double lr, mfs_hparams_t *out);
/** lr.* and sgd.lr with the given schedule (lr.schedule offline, serve.lr_schedule streaming). */
void mfs_lr_conf_from(const mfs_conf_t *c, int schedule, mfs_lr_conf_t *out);
/** model.k, model.init_scale, model.seed. */
void mfs_model_conf_from(const mfs_conf_t *c, mfs_model_conf_t *out);
/** The stream's (serve) controller: serve.lr_schedule from serve.lr (not train's sgd.lr), the
 *  other lr.* keys as mfs_lr_conf_from, no start off a plateau (that is for offline epochs). */
void mfs_lr_conf_stream(const mfs_conf_t *c, mfs_lr_conf_t *out);
/** The stream's model: as mfs_model_conf_from, new rows drawn with serve.init_scale. */
void mfs_model_conf_stream(const mfs_conf_t *c, mfs_model_conf_t *out);

#endif
