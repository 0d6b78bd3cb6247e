/* id.c - external ids: text form, validation. See store.h for the rules. */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "model_store/store.h"

/* Canonical decimal u64: 1..20 digits, no leading zero unless "0", no overflow. */
static int parse_canonical_u64(const char *s, size_t len, uint64_t *out)
{
	if (len == 0 || len > 20 || (len > 1 && s[0] == '0'))
		return -1;
	uint64_t v = 0;
	for (size_t i = 0; i < len; i++) {
		unsigned d = (unsigned)(unsigned char)s[i] - '0';
		if (d > 9)
			return -1;
		if (v > (UINT64_MAX - d) / 10)
			return -1; /* overflow: the token is a string id */
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
static int utf8_valid(const unsigned char *s, size_t len)
{
	size_t i = 0;
	while (i < len) {
		unsigned char c = s[i];
		size_t n;
		uint32_t cp;
		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xE0) == 0xC0) {
			n = 1;
			cp = c & 0x1F;
		} else if ((c & 0xF0) == 0xE0) {
			n = 2;
			cp = c & 0x0F;
		} else if ((c & 0xF8) == 0xF0) {
			n = 3;
			cp = c & 0x07;
		} else {
			return 0;
		}
		if (i + n >= len)
			return 0; /* truncated sequence */
		for (size_t j = 1; j <= n; j++) {
			if ((s[i + j] & 0xC0) != 0x80)
				return 0;
			cp = (cp << 6) | (s[i + j] & 0x3F);
		}
		if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
		    (cp >= 0xD800 && cp <= 0xDFFF))
			return 0;
		i += n + 1;
	}
	return 1;
}

int mfs_id_check(const mfs_id_t *id)
{
	if (id->kind == MFS_ID_U64)
		return 0;
	if (id->kind != MFS_ID_STR || (id->len && !id->str))
		return MFS_EINVAL;
	if (id->len == 0 || id->len > MFS_ID_MAX_LEN)
		return MFS_EIDLEN;
	return utf8_valid((const unsigned char *)id->str, id->len) ? 0 : MFS_EINVAL;
}

int mfs_id_parse(const char *s, size_t len, mfs_id_t *out)
{
	uint64_t v;
	if (parse_canonical_u64(s, len, &v) == 0) {
		*out = mfs_id_u64(v);
		return 0;
	}
	if (len >= 4 && memcmp(s, "str:", 4) == 0) {
		s += 4;
		len -= 4;
	}
	if (len == 0 || len > MFS_ID_MAX_LEN)
		return MFS_EIDLEN;
	out->kind = MFS_ID_STR;
	out->len = (uint16_t)len;
	out->num = 0;
	out->str = s;
	return 0;
}

const char *mfs_id_format(const mfs_id_t *id, char *buf, size_t size)
{
	if (id->kind == MFS_ID_U64) {
		snprintf(buf, size, "%llu", (unsigned long long)id->num);
		return buf;
	}
	uint64_t v;
	/* a string that would read back as a number (or as a "str:" prefix) gets the prefix */
	int need_prefix = parse_canonical_u64(id->str, id->len, &v) == 0 ||
	                  (id->len >= 4 && memcmp(id->str, "str:", 4) == 0);
	snprintf(buf, size, "%s%.*s", need_prefix ? "str:" : "", (int)id->len, id->str);
	return buf;
}
