/* The prefixes of xla/ffi/api/c_api.h that iris's C handlers read (fault_gate.c, host_meeting.c),
 * and the two answers every handler gives: the metadata query and an error. */
#ifndef IRIS_XLA_FFI_H
#define IRIS_XLA_FFI_H
#include <stddef.h>
#include <stdint.h>

typedef struct Extension { size_t struct_size; int type; struct Extension *next; } Extension;
typedef struct { size_t struct_size; void *extension_start; int major; int minor; } ApiVersion;
typedef struct { size_t struct_size; ApiVersion api_version; uint32_t traits; int64_t state_type_id; } Metadata;
typedef struct { Extension base; Metadata *metadata; } MetadataExtension;
typedef struct { size_t struct_size; void *extension_start; ApiVersion api_version; void *internal_api;
                 void *functions[]; } Api;
typedef struct { size_t struct_size; void *extension_start; int dtype; void *data; int64_t rank;
                 int64_t *dims; } Buffer;
typedef struct { size_t struct_size; void *extension_start; int64_t size; void *types; Buffer **values; } Buffers;
typedef struct { size_t struct_size; void *extension_start; int64_t size; int *types; void **names;
                 void **values; } Attrs;
typedef struct { int dtype; void *value; } Scalar;  /* a scalar attribute */
typedef struct { size_t struct_size; Extension *extension_start; const Api *api; void *ctx; int stage;
                 Buffers args; Buffers rets; Attrs attrs; } CallFrame;
typedef struct { size_t struct_size; void *extension_start; const char *message; int errc; } ErrorCreateArgs;
typedef struct { size_t struct_size; void *extension_start; void *ctx; void *value; } QueryArgs;
typedef void *(*ErrorCreate)(ErrorCreateArgs *);
typedef void *(*Query)(QueryArgs *);

enum { METADATA_EXTENSION = 1, PREPARE = 1, EXECUTE = 3, UNKNOWN_ERROR = 2 };
enum { NO_TRAITS = 0, COMMAND_BUFFER_COMPATIBLE = 1 };  /* XLA_FFI_Handler_TraitsBits */
enum { ERROR_CREATE = 0, STREAM_GET = 4, RUN_ID_GET = 16 };  /* positions in Api.functions */

/* Answers XLA's metadata query (API version 0.1, `traits`) when that is what `frame` is. */
static inline int answered_metadata(CallFrame *frame, uint32_t traits) {
    Extension *ext = frame->extension_start;
    if (!ext || ext->type != METADATA_EXTENSION) return 0;
    Metadata *metadata = ((MetadataExtension *)ext)->metadata;
    metadata->api_version.major = 0;
    metadata->api_version.minor = 1;
    metadata->traits = traits;
    return 1;
}

/* The call's error (XLA copies `message`). */
static inline void *ffi_error(CallFrame *frame, const char *message) {
    ErrorCreateArgs args = {sizeof(ErrorCreateArgs), NULL, message, UNKNOWN_ERROR};
    return ((ErrorCreate)frame->api->functions[ERROR_CREATE])(&args);
}
#endif
