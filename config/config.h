/* config.h - the configuration (generated from properties.def).
 *
 * Precedence, lowest to highest: built-in defaults < config file (INI, parsed by libinih)
 * < MFSTREAM_* environment variables < command-line --key value flags.
 * Unknown keys and out-of-range values are errors that name the key and the allowed range.
 * kafka.* keys are kept verbatim for librdkafka.
 */
#ifndef MFS_CONFIG_H
#define MFS_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { MFS_P_IMMUTABLE = 1, MFS_P_HIDDEN = 4 };

#define MFS_CONF_KAFKA_MAX 64

typedef struct mfs_conf {
#define MFS_INT(f, k, d, lo, hi, fl, doc) int64_t f;
#define MFS_DBL(f, k, d, lo, hi, fl, doc) double f;
#define MFS_STR(f, k, d, fl, doc) char *f;
#define MFS_ENUM(f, k, d, ch, fl, doc) int f;
#define MFS_BOOL(f, k, d, fl, doc) int f;
#include "config/properties.def"
#undef MFS_INT
#undef MFS_DBL
#undef MFS_STR
#undef MFS_ENUM
#undef MFS_BOOL
	/* kafka.* pass-through, in the order set (later duplicates override earlier ones) */
	char *kafka_key[MFS_CONF_KAFKA_MAX];
	char *kafka_val[MFS_CONF_KAFKA_MAX];
	int kafka_n;
	char *config_path; /* the config file that was read, if any */
} mfs_conf_t;

/** Defaults. @return 0 or ENOMEM. */
int mfs_conf_init(mfs_conf_t *c);
void mfs_conf_free(mfs_conf_t *c);
/** Set one key from its text value. @return 0 or MFS_ECONFIG (errstr names key and range). */
int mfs_conf_set(mfs_conf_t *c, const char *key, const char *value, char *errstr, size_t errstr_size);
/** Read an INI file: "[sgd]\nlr = 0.02" sets sgd.lr; keys before any section are full names.
 *  Blank and comment lines may be any length; a [section] or key = value line up to 64 KiB.
 *  @return 0; MFS_ECONFIG (errstr names the file, the line and the key or the fault); ENOMEM;
 *  or the errno of a read error. */
int mfs_conf_load_file(mfs_conf_t *c, const char *path, char *errstr, size_t errstr_size);
/** Apply MFSTREAM_* variables of envp (NULL-terminated): MFSTREAM_SGD_LR -> sgd.lr,
 *  MFSTREAM_KAFKA_BOOTSTRAP_SERVERS -> kafka.bootstrap.servers. MFSTREAM_CONFIG is the file. */
int mfs_conf_load_env(mfs_conf_t *c, char *const *envp, char *errstr, size_t errstr_size);

/** A command-line alias: --input -> train.input, ... */
typedef struct mfs_conf_alias {
	const char *flag;
	const char *key;
} mfs_conf_alias_t;

/** The whole chain for a subcommand: defaults, file (--config F or MFSTREAM_CONFIG), env,
 *  then flags. Flags are "--key value", "--key=value", or an alias; a flag naming a boolean
 *  key may omit its value. Arguments that are not flags are returned in positional[] (at
 *  most max_pos). @return 0 or MFS_ECONFIG. */
int mfs_conf_load_all(mfs_conf_t *c, int argc, char **argv, char *const *envp,
                      const mfs_conf_alias_t *aliases, char **positional, int max_pos, int *n_pos,
                      char *errstr, size_t errstr_size);

/** Text value of a key ("" for unset strings). @return 0 or MFS_ECONFIG. */
int mfs_conf_get(const mfs_conf_t *c, const char *key, char *buf, size_t size);
/** Print every (non-hidden) key = value as a loadable INI file. */
void mfs_conf_dump(const mfs_conf_t *c, FILE *f);
/** Markdown reference of the table (docs/CONFIGURATION.md). */
void mfs_conf_gen_doc(FILE *f);
/** A fully commented config file with every default (mfstream.conf.example). */
void mfs_conf_gen_example(FILE *f);
/** Index of an enum choice name for key, or -1. */
int mfs_conf_enum_index(const char *key, const char *choice);
const char *mfs_conf_enum_name(const char *key, int index);

#endif
