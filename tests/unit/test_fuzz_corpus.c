/* test_fuzz_corpus.c - replay the event fuzzer's seed corpus through the fuzz target itself.
 *
 * The libFuzzer target (tests/fuzz/fuzz_event.c) checks every input against the reference
 * decoder and the encode/decode round trip, and aborts on any disagreement. Running its
 * corpus here keeps those checks in every CI run, which has no clang/libFuzzer; long fuzzing
 * runs use tests/fuzz/build.sh. An abort fails this test.
 */
#include <dirent.h>

#include "../fuzz/fuzz_event.c"
#include "testhelp.h"

int main(void)
{
	const char *dir = "tests/fuzz/corpus_event";
	DIR *d = opendir(dir);
	if (!d)
		TEST_SKIP("%s not found (run from the source root)", dir);
	int files = 0;
	struct dirent *ent;
	while ((ent = readdir(d))) {
		if (ent->d_name[0] == '.')
			continue;
		char path[1024];
		snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
		FILE *f = fopen(path, "rb");
		if (!f)
			continue;
		static uint8_t buf[1 << 16];
		size_t n = fread(buf, 1, sizeof buf, f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
		files++;
	}
	closedir(d);
	fprintf(stderr, "replayed %d corpus files\n", files);
	th_tests = 1;
	TEST_ASSERT_MSG(files >= 20, "only %d corpus files", files);
	return TEST_REPORT();
}
