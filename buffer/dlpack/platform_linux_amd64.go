package dlpack

const sysProcessVMReadv = 310
