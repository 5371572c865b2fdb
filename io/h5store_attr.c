/* Root attributes: the writer's (one scalar each, created collectively
 * with the file) and the reader's (independent: by key, or all of them to
 * carry them over into another file). Integers are int64, floats double,
 * strings variable-length UTF-8 (h5py's str); a reader also accepts
 * fixed-length strings, and reads an integer as a double. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/errmsg.h"
#include "io/h5store_internal.h"

int h5s_write_attr(hid_t loc, const h5store_attr_t *a, char *err, size_t errlen)
{
    hid_t space = H5Screate(H5S_SCALAR), ftype = H5I_INVALID_HID, attr = H5I_INVALID_HID;
    hid_t mtype;
    const void *val;
    int rc = -1;
    if (space < 0) {
        h5s_err(err, errlen, "attribute %s: H5Screate", a->key);
        return -1;
    }
    if (a->type == H5STORE_INT) {
        ftype = H5Tcopy(H5T_STD_I64LE);
        mtype = H5T_NATIVE_INT64;
        val = &a->i;
    } else if (a->type == H5STORE_DOUBLE) {
        ftype = H5Tcopy(H5T_IEEE_F64LE);
        mtype = H5T_NATIVE_DOUBLE;
        val = &a->d;
    } else {
        /* variable-length UTF-8: h5py reads it as a Python str */
        ftype = H5Tcopy(H5T_C_S1);
        if (ftype >= 0 && (H5Tset_size(ftype, H5T_VARIABLE) < 0 || H5Tset_cset(ftype, H5T_CSET_UTF8) < 0)) {
            h5s_err(err, errlen, "attribute %s: string type", a->key);
            goto done;
        }
        mtype = ftype;
        val = &a->s;
    }
    if (ftype < 0) {
        h5s_err(err, errlen, "attribute %s: H5Tcopy", a->key);
        goto done;
    }
    attr = H5Acreate2(loc, a->key, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0) {
        h5s_err(err, errlen, "cannot create attribute %s", a->key);
        goto done;
    }
    if (H5Awrite(attr, mtype, val) < 0) {
        h5s_err(err, errlen, "cannot write attribute %s", a->key);
        goto done;
    }
    rc = 0;
done:
    rc = h5s_close_msg(attr, H5Aclose, rc, err, errlen, "attribute %s: H5Aclose", a->key);
    rc = h5s_close_msg(ftype, H5Tclose, rc, err, errlen, "attribute %s: H5Tclose", a->key);
    return h5s_close_msg(space, H5Sclose, rc, err, errlen, "attribute %s: H5Sclose", a->key);
}

int h5store_has_attr(h5store_t *h, const char *key)
{
    h5s_quiet_t q;
    h5s_quiet_on(&q);
    htri_t r = H5Aexists(h->file, key);
    if (r < 0 && H5Eclear2(H5E_DEFAULT) < 0) {
    }
    h5s_quiet_off(&q);
    return r > 0;
}

/* Opens root attribute `key` holding one value; *cls gets its type class. */
static hid_t open_attr(h5store_t *h, const char *key, H5T_class_t *cls, hid_t *type, char *err, size_t errlen)
{
    htri_t ex = H5Aexists(h->file, key);
    if (ex <= 0) {
        if (ex < 0)
            h5s_err(err, errlen, "%s: attribute %s", h->path, key);
        else
            seterr(err, errlen, "%s: no attribute %s", h->path, key);
        return H5I_INVALID_HID;
    }
    hid_t attr = H5Aopen(h->file, key, H5P_DEFAULT), space = H5I_INVALID_HID;
    *type = H5I_INVALID_HID;
    if (attr < 0 || (space = H5Aget_space(attr)) < 0 || (*type = H5Aget_type(attr)) < 0 ||
        (*cls = H5Tget_class(*type)) < 0) {
        h5s_err(err, errlen, "%s: cannot open attribute %s", h->path, key);
        goto fail;
    }
    hssize_t n = H5Sget_simple_extent_npoints(space);
    if (n != 1) {
        seterr(err, errlen, "%s: attribute %s holds %lld values, expected 1", h->path, key, (long long)n);
        goto fail;
    }
    if (H5Sclose(space) < 0) {
        space = H5I_INVALID_HID;
        h5s_err(err, errlen, "H5Sclose");
        goto fail;
    }
    return attr;
fail:
    /* already failing: the first message stands */
    (void)h5s_close(space, H5Sclose, -1);
    (void)h5s_close(*type, H5Tclose, -1);
    (void)h5s_close(attr, H5Aclose, -1);
    *type = H5I_INVALID_HID;
    return H5I_INVALID_HID;
}

static const char *class_name(H5T_class_t c)
{
    switch (c) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    default: return "not a number or string";
    }
}

static int close_attr(hid_t attr, hid_t type, int rc, char *err, size_t errlen)
{
    rc = h5s_close_msg(type, H5Tclose, rc, err, errlen, "H5Tclose");
    return h5s_close_msg(attr, H5Aclose, rc, err, errlen, "H5Aclose");
}

/* Integer or float attribute as `want` (H5T_INTEGER -> int64, H5T_FLOAT -> double). */
static int get_num(h5store_t *h, const char *key, H5T_class_t want, void *v, char *err, size_t errlen)
{
    h5s_quiet_t q;
    H5T_class_t cls = H5T_NO_CLASS;
    hid_t type, attr;
    int rc = -1;
    h5s_quiet_on(&q);
    attr = open_attr(h, key, &cls, &type, err, errlen);
    if (attr >= 0) {
        if (cls != want && !(want == H5T_FLOAT && cls == H5T_INTEGER))
            seterr(err, errlen, "%s: attribute %s is %s, expected %s", h->path, key, class_name(cls), class_name(want));
        else if (H5Aread(attr, want == H5T_INTEGER ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, v) < 0)
            h5s_err(err, errlen, "%s: cannot read attribute %s", h->path, key);
        else
            rc = 0;
        rc = close_attr(attr, type, rc, err, errlen);
    }
    h5s_quiet_off(&q);
    return rc;
}

int h5store_get_int(h5store_t *h, const char *key, int64_t *v, char *err, size_t errlen)
{
    return get_num(h, key, H5T_INTEGER, v, err, errlen);
}

int h5store_get_double(h5store_t *h, const char *key, double *v, char *err, size_t errlen)
{
    return get_num(h, key, H5T_FLOAT, v, err, errlen);
}

/* Root attribute `key` as a string in memory the caller frees. */
static int read_str(h5store_t *h, const char *key, char **out, char *err, size_t errlen)
{
    h5s_quiet_t q;
    H5T_class_t cls = H5T_NO_CLASS;
    hid_t type, attr, mt = H5I_INVALID_HID;
    int rc = -1;
    char *s = NULL;
    htri_t var = 0;
    *out = NULL;
    h5s_quiet_on(&q);
    attr = open_attr(h, key, &cls, &type, err, errlen);
    if (attr < 0)
        goto done;
    if (cls != H5T_STRING) {
        seterr(err, errlen, "%s: attribute %s is %s, expected a string", h->path, key, class_name(cls));
        goto done;
    }
    var = H5Tis_variable_str(type);
    size_t fixed = H5Tget_size(type);
    H5T_cset_t cset = H5Tget_cset(type); /* ASCII <-> UTF-8 has no conversion path */
    if (var < 0 || cset < 0 || (mt = H5Tcopy(H5T_C_S1)) < 0 || H5Tset_size(mt, var ? H5T_VARIABLE : fixed + 1) < 0 ||
        H5Tset_cset(mt, cset) < 0) {
        h5s_err(err, errlen, "%s: attribute %s: string type", h->path, key);
        goto done;
    }
    if (var) {
        if (H5Aread(attr, mt, &s) < 0) {
            h5s_err(err, errlen, "%s: cannot read attribute %s", h->path, key);
            goto done;
        }
    } else {
        /* fixed-length (e.g. numpy bytes): one more byte for the NUL */
        if (!(s = calloc(fixed + 1, 1))) {
            seterr(err, errlen, "out of memory");
            goto done;
        }
        if (H5Aread(attr, mt, s) < 0) {
            h5s_err(err, errlen, "%s: cannot read attribute %s", h->path, key);
            goto done;
        }
    }
    /* HDF5 allocated a variable-length string: the copy is ours to free */
    if (!(*out = strdup(s ? s : ""))) {
        seterr(err, errlen, "out of memory");
        goto done;
    }
    rc = 0;
done:
    if (s && var) {
        if (H5free_memory(s) < 0 && rc == 0) {
            h5s_err(err, errlen, "H5free_memory");
            rc = -1;
        }
    } else {
        free(s);
    }
    rc = h5s_close(mt, H5Tclose, rc);
    if (attr >= 0)
        rc = close_attr(attr, type, rc, err, errlen);
    if (rc != 0) {
        free(*out);
        *out = NULL;
    }
    h5s_quiet_off(&q);
    return rc;
}

int h5store_get_str(h5store_t *h, const char *key, char *out, size_t outlen, char *err, size_t errlen)
{
    char *s;
    if (read_str(h, key, &s, err, errlen) != 0)
        return -1;
    size_t n = strlen(s);
    int rc = 0;
    if (n >= outlen) {
        seterr(err, errlen, "%s: attribute %s is %zu bytes, longer than the %zu-byte buffer", h->path, key, n, outlen);
        rc = -1;
    } else {
        memcpy(out, s, n + 1);
    }
    free(s);
    return rc;
}

typedef struct attr_names {
    char **name;
    int n, cap;
} attr_names_t;

static herr_t attr_name_cb(hid_t loc, const char *name, const H5A_info_t *info, void *data)
{
    attr_names_t *a = data;
    (void)loc;
    (void)info;
    if (strncmp(name, RESERVED_PREFIX, strlen(RESERVED_PREFIX)) == 0)
        return 0;
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        char **p = realloc(a->name, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        a->name = p;
        a->cap = cap;
    }
    if (!(a->name[a->n] = strdup(name)))
        return -1;
    a->n++;
    return 0;
}

void h5store_free_attrs(h5store_attr_t *attrs, int n)
{
    if (!attrs)
        return;
    /* the strings were allocated by h5store_get_attrs; const is for readers */
    for (int i = 0; i < n; i++) {
        free((char *)attrs[i].key);
        free((char *)attrs[i].s);
    }
    free(attrs);
}

int h5store_get_attrs(h5store_t *h, h5store_attr_t **attrs, int *n_attrs, char *err, size_t errlen)
{
    attr_names_t names = {NULL, 0, 0};
    h5store_attr_t *a = NULL;
    int rc = 0;
    h5s_quiet_t q;
    h5s_quiet_on(&q);
    /* names first, then values, so no attribute is opened from inside
     * HDF5's iteration */
    hsize_t idx = 0;
    if (H5Aiterate2(h->file, H5_INDEX_NAME, H5_ITER_INC, &idx, attr_name_cb, &names) < 0) {
        h5s_err(err, errlen, "%s: cannot list its root attributes", h->path);
        rc = -1;
    }
    h5s_quiet_off(&q);
    if (rc == 0 && !(a = calloc((size_t)names.n + 1, sizeof *a))) {
        seterr(err, errlen, "out of memory");
        rc = -1;
    }
    int n = 0;
    for (int i = 0; i < names.n && rc == 0; i++, n++) {
        a[n].key = names.name[i];
        names.name[i] = NULL; /* owned by a[] from here */
        H5T_class_t cls = H5T_NO_CLASS;
        hid_t type, attr;
        h5s_quiet_on(&q);
        attr = open_attr(h, a[n].key, &cls, &type, err, errlen);
        h5s_quiet_off(&q);
        if (attr < 0 || close_attr(attr, type, 0, err, errlen) != 0) {
            rc = -1;
        } else if (cls == H5T_INTEGER) {
            a[n].type = H5STORE_INT;
            rc = get_num(h, a[n].key, H5T_INTEGER, &a[n].i, err, errlen);
        } else if (cls == H5T_FLOAT) {
            a[n].type = H5STORE_DOUBLE;
            rc = get_num(h, a[n].key, H5T_FLOAT, &a[n].d, err, errlen);
        } else if (cls == H5T_STRING) {
            char *s = NULL;
            a[n].type = H5STORE_STR;
            rc = read_str(h, a[n].key, &s, err, errlen);
            a[n].s = s;
        } else {
            seterr(err, errlen, "%s: attribute %s is %s, expected an integer, a float or a string", h->path, a[n].key,
                   class_name(cls));
            rc = -1;
        }
    }
    for (int i = 0; i < names.n; i++)
        free(names.name[i]);
    free(names.name);
    if (rc != 0) {
        h5store_free_attrs(a, n);
        return -1;
    }
    *attrs = a;
    *n_attrs = n;
    return 0;
}
