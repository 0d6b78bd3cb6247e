/* cmd.h - subcommands of the mfstream binary. argv[0] is the subcommand name. Each returns
 * the process exit code:
 * 0 success, 1 failure at run time, 2 bad usage or configuration. */
#ifndef MFS_CMD_H
#define MFS_CMD_H

#include "config/config.h"

int mfs_cmd_train(int argc, char **argv);
int mfs_cmd_gen(int argc, char **argv);
int mfs_cmd_query(int argc, char **argv);
int mfs_cmd_predict(int argc, char **argv);
int mfs_cmd_inspect(int argc, char **argv);
int mfs_cmd_produce(int argc, char **argv);
int mfs_cmd_serve(int argc, char **argv);
int mfs_cmd_config(int argc, char **argv);

/** Remove "--name value" / "--name=value" from argv (every occurrence; the last one wins into
 *  *val). @return 1 found, 0 not found, -1 the flag has no value. */
int mfs_cmd_take_flag(int *argc, char **argv, const char *name, const char **val);
/** The same, collecting up to max values in order. @return the number kept, or -1. */
int mfs_cmd_take_all(int *argc, char **argv, const char *name, const char **vals, int max);
/** Remove a value-less flag from argv. @return 1 if it was there. */
int mfs_cmd_take_bool(int *argc, char **argv, const char *name);

/** Load the configuration chain for a subcommand (see mfs_conf_load_all), apply log.level,
 *  and print any error. @return 0, or 2 after printing the error. */
int mfs_cmd_conf(const char *cmd, int argc, char **argv, const mfs_conf_alias_t *aliases, mfs_conf_t *c,
                 char **positional, int max_pos, int *n_pos);

#endif
